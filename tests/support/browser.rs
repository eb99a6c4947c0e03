//! A real headless Chromium for the console tests, driven through chromedriver with
//! fantoccini (WebDriver). Each [`Page`] starts its own chromedriver on a free loopback port
//! and its own browser with a fresh profile, and stops both when dropped.
//!
//! Chromium and chromedriver are found at `$PRX_HOOKS_CHROMIUM` / `$PRX_HOOKS_CHROMEDRIVER`,
//! else on PATH (`chromium`, `chromium-browser`, `google-chrome`; `chromedriver`). A machine
//! without them FAILS the test with the command that installs them: a browser test that
//! skips itself would pass CI without testing anything.
//!
//! Screenshots go to `target/console-screenshots/<name>.png` (or `$PRX_HOOKS_SCREENSHOTS`).

#![allow(dead_code)] // each test uses a different subset

use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::{Value, json};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const INSTALL: &str = "apt-get install -y chromium chromium-driver";

/// How long a page condition may take (liveness on a loaded 2-core machine, not speed).
pub const PATIENCE: Duration = Duration::from_secs(30);

/// The viewport a page opens with.
#[derive(Clone, Copy, Debug)]
pub enum Viewport {
    /// 1280×800, a laptop.
    Desktop,
    /// 375×812 CSS pixels at device pixel ratio 2, touch (Chromium's mobile emulation).
    Phone,
}

pub struct Page {
    rt: tokio::runtime::Runtime,
    client: Option<Client>,
    session: String,
    driver: Child,
    driver_url: String,
    _profile: tempfile::TempDir,
    pub log: PathBuf,
}

fn find(env: &str, names: &[&str]) -> Option<PathBuf> {
    if let Some(p) = std::env::var_os(env) {
        return Some(PathBuf::from(p));
    }
    let path = std::env::var_os("PATH")?;
    for dir in std::env::split_paths(&path) {
        for n in names {
            let p = dir.join(n);
            if p.is_file() {
                return Some(p);
            }
        }
    }
    None
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Where screenshots are written.
pub fn screenshot_dir() -> PathBuf {
    match std::env::var_os("PRX_HOOKS_SCREENSHOTS") {
        Some(d) => PathBuf::from(d),
        None => Path::new(env!("CARGO_TARGET_TMPDIR"))
            .parent()
            .unwrap()
            .join("console-screenshots"),
    }
}

impl Page {
    pub fn open(viewport: Viewport) -> Page {
        let chromium = find(
            "PRX_HOOKS_CHROMIUM",
            &["chromium", "chromium-browser", "google-chrome"],
        )
        .unwrap_or_else(|| {
            panic!("no Chromium found (set PRX_HOOKS_CHROMIUM or install it: {INSTALL})")
        });
        let chromedriver = find("PRX_HOOKS_CHROMEDRIVER", &["chromedriver"]).unwrap_or_else(|| {
            panic!("no chromedriver found (set PRX_HOOKS_CHROMEDRIVER or install it: {INSTALL})")
        });
        let profile = tempfile::tempdir().unwrap();
        let log = profile.path().join("chromedriver.log");
        let port = free_port();
        let mut cmd = Command::new(&chromedriver);
        cmd.arg(format!("--port={port}"))
            .arg(format!("--log-path={}", log.display()))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        {
            use std::os::unix::process::CommandExt;
            // SAFETY: prctl(PR_SET_PDEATHSIG) is async-signal-safe and touches no memory of
            // the parent; it only asks the kernel to kill chromedriver if this thread dies
            // (a test that panics before Drop runs).
            unsafe {
                cmd.pre_exec(|| {
                    libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                    Ok(())
                });
            }
        }
        let mut driver = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("{}: {e} (install: {INSTALL})", chromedriver.display()));
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        let deadline = Instant::now() + PATIENCE;
        while TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err() {
            if let Ok(Some(status)) = driver.try_wait() {
                panic!(
                    "chromedriver exited at start ({status}); its log: {}",
                    log.display()
                );
            }
            assert!(
                Instant::now() < deadline,
                "chromedriver did not listen on {addr}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        let mut args = vec![
            "--headless".to_string(),
            "--disable-gpu".into(),
            "--disable-quic".into(),
            "--no-first-run".into(),
            "--no-default-browser-check".into(),
            "--disable-background-networking".into(),
            "--disable-component-update".into(),
            "--disable-sync".into(),
            "--disable-extensions".into(),
            "--disable-dev-shm-usage".into(),
            "--hide-scrollbars".into(),
            "--force-color-profile=srgb".into(),
            "--lang=en-US".into(),
            format!(
                "--user-data-dir={}",
                profile.path().join("profile").display()
            ),
        ];
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } == 0 {
            // Chromium refuses to start its sandbox as root.
            args.push("--no-sandbox".into());
        }
        let mut options = json!({
            "binary": chromium,
            "args": args,
        });
        match viewport {
            Viewport::Desktop => {
                options["args"]
                    .as_array_mut()
                    .unwrap()
                    .push("--window-size=1280,800".into());
            }
            Viewport::Phone => {
                options["mobileEmulation"] = json!({
                    "deviceMetrics": {"width": 375, "height": 812, "pixelRatio": 2.0, "touch": true, "mobile": true},
                    "userAgent": "Mozilla/5.0 (Linux; Android 14; Pixel 8) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/148.0 Mobile Safari/537.36",
                });
            }
        }
        let mut caps = serde_json::Map::new();
        caps.insert("browserName".into(), json!("chrome"));
        caps.insert("goog:chromeOptions".into(), options);
        caps.insert("goog:loggingPrefs".into(), json!({"browser": "ALL"}));
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let driver_url = format!("http://{addr}");
        // On a loaded machine Chromium can miss chromedriver's start-up deadline
        // ("DevToolsActivePort file doesn't exist"): try again with a fresh profile, twice.
        let mut attempt = 0;
        let client = loop {
            attempt += 1;
            let profile_dir = profile.path().join(format!("profile-{attempt}"));
            caps["goog:chromeOptions"]["args"]
                .as_array_mut()
                .unwrap()
                .retain(|a| !a.as_str().unwrap().starts_with("--user-data-dir="));
            caps["goog:chromeOptions"]["args"]
                .as_array_mut()
                .unwrap()
                .push(format!("--user-data-dir={}", profile_dir.display()).into());
            match rt.block_on(
                ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
                    .capabilities(caps.clone())
                    .connect(&driver_url),
            ) {
                Ok(c) => break c,
                Err(e) if attempt < 3 => eprintln!("Chromium did not start ({e}); trying again"),
                Err(e) => {
                    let log = std::fs::read(&log).unwrap_or_default();
                    let tail = String::from_utf8_lossy(&log[log.len().saturating_sub(4000)..]);
                    panic!("could not start Chromium through chromedriver: {e}\n{tail}")
                }
            }
        };
        let session = rt.block_on(client.session_id()).unwrap().unwrap();
        Page {
            rt,
            client: Some(client),
            session,
            driver,
            driver_url,
            _profile: profile,
            log,
        }
    }

    fn c(&self) -> &Client {
        self.client.as_ref().unwrap()
    }

    pub fn goto(&self, url: &str) {
        self.rt.block_on(self.c().goto(url)).unwrap();
    }

    pub fn url(&self) -> String {
        self.rt
            .block_on(self.c().current_url())
            .unwrap()
            .to_string()
    }

    /// Runs `script` (a function body; `arguments[0..]` are `args`) and returns its value.
    pub fn js(&self, script: &str, args: Vec<Value>) -> Value {
        self.rt
            .block_on(self.c().execute(script, args))
            .unwrap_or_else(|e| panic!("script failed: {e}\n{script}"))
    }

    /// Polls `script` until it returns something other than null, false, 0 or "" and returns
    /// that; fails after [`PATIENCE`] with `what` and the browser's console.
    pub fn wait(&self, what: &str, script: &str, args: Vec<Value>) -> Value {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let v = self.js(script, args.clone());
            let truthy = match &v {
                Value::Null => false,
                Value::Bool(b) => *b,
                Value::Number(n) => n.as_f64() != Some(0.0),
                Value::String(s) => !s.is_empty(),
                _ => true,
            };
            if truthy {
                return v;
            }
            if Instant::now() >= deadline {
                self.shot("timeout");
                panic!(
                    "timed out waiting for {what}\nbrowser console:\n{}",
                    self.console().join("\n")
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// [`Page::wait`], calling `tick` before each poll (to keep something happening).
    pub fn wait_with(&self, what: &str, mut tick: impl FnMut(), script: &str) -> Value {
        let deadline = Instant::now() + PATIENCE * 2;
        loop {
            tick();
            let v = self.js(script, vec![]);
            if !v.is_null() && v != Value::Bool(false) {
                return v;
            }
            if Instant::now() >= deadline {
                self.shot("timeout");
                panic!("timed out waiting for {what}");
            }
            std::thread::sleep(Duration::from_millis(150));
        }
    }

    /// Waits for an element matching `css` that is displayed.
    pub fn wait_visible(&self, css: &str) {
        self.wait(
            &format!("{css} to be visible"),
            "const e = document.querySelector(arguments[0]); return !!e && e.getClientRects().length > 0 && !e.closest('[hidden]');",
            vec![json!(css)],
        );
    }

    pub fn click(&self, css: &str) {
        self.wait_visible(css);
        // In the middle of the viewport, clear of the sticky header.
        self.js(
            "document.querySelector(arguments[0]).scrollIntoView({block: 'center'});",
            vec![json!(css)],
        );
        let e = self
            .rt
            .block_on(self.c().find(Locator::Css(css)))
            .unwrap_or_else(|e| panic!("{css}: {e}"));
        self.rt.block_on(e.click()).unwrap();
    }

    /// Replaces the value of the field `css` by typing `text` into it.
    pub fn fill(&self, css: &str, text: &str) {
        self.wait_visible(css);
        let e = self.rt.block_on(self.c().find(Locator::Css(css))).unwrap();
        self.rt.block_on(e.clear()).unwrap();
        self.rt.block_on(e.send_keys(text)).unwrap();
    }

    /// Types `keys` (text and `fantoccini::key::Key` characters) into the focused element.
    pub fn keys(&self, keys: &str) {
        let e = self.rt.block_on(self.c().active_element()).unwrap();
        self.rt.block_on(e.send_keys(keys)).unwrap();
    }

    /// `textContent` of the first element matching `css` ("" when none).
    pub fn text(&self, css: &str) -> String {
        self.js(
            "const e = document.querySelector(arguments[0]); return e ? e.textContent : '';",
            vec![json!(css)],
        )
        .as_str()
        .unwrap_or("")
        .to_string()
    }

    /// Writes the viewport's PNG to the screenshot directory; returns its path.
    pub fn shot(&self, name: &str) -> PathBuf {
        let png = self.rt.block_on(self.c().screenshot()).unwrap();
        assert!(png.starts_with(b"\x89PNG"), "a PNG");
        let dir = screenshot_dir();
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(format!("{name}.png"));
        std::fs::write(&path, png).unwrap();
        path
    }

    /// The browser console's messages so far (chromedriver's log endpoint), as `LEVEL text`.
    pub fn console(&self) -> Vec<String> {
        let url = format!("{}/session/{}/se/log", self.driver_url, self.session);
        let r = http(
            "POST",
            &url,
            &[("content-type", "application/json")],
            br#"{"type":"browser"}"#,
        );
        let body: Value = serde_json::from_str(&r.text).unwrap_or(Value::Null);
        body["value"]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|m| {
                        format!(
                            "{} {}",
                            m["level"].as_str().unwrap_or("?"),
                            m["message"].as_str().unwrap_or("")
                        )
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Fails on any script error in the console since the last call (failed resource loads,
    /// such as a 401 the page expects, are not script errors).
    pub fn assert_no_script_errors(&self) {
        let errors: Vec<String> = self
            .console()
            .into_iter()
            .filter(|m| m.starts_with("SEVERE") && !m.contains("Failed to load resource"))
            .collect();
        assert!(errors.is_empty(), "script errors:\n{}", errors.join("\n"));
    }
}

impl Drop for Page {
    fn drop(&mut self) {
        if let Some(c) = self.client.take() {
            let _ = self
                .rt
                .block_on(async { tokio::time::timeout(Duration::from_secs(10), c.close()).await });
        }
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

/// A response, read whole.
pub struct Resp {
    pub status: u16,
    pub headers: ureq::http::HeaderMap,
    pub text: String,
}

impl Resp {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    pub fn json(&self) -> Value {
        serde_json::from_str(&self.text).unwrap_or_else(|e| panic!("{e}: {}", self.text))
    }
}

/// One HTTP/1.1 request (ureq; any status is an answer, not an error).
pub fn http(method: &str, url: &str, headers: &[(&str, &str)], body: &[u8]) -> Resp {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(60)))
        .build()
        .into();
    let mut req = ureq::http::Request::builder().method(method).uri(url);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let mut resp = agent
        .run(req.body(body.to_vec()).unwrap())
        .unwrap_or_else(|e| panic!("{method} {url}: {e}"));
    Resp {
        status: resp.status().as_u16(),
        headers: resp.headers().clone(),
        text: resp.body_mut().read_to_string().unwrap_or_default(),
    }
}
