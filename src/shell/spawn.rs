//! Starting one hook process (ARCHITECTURE.md § Shell hooks: containment).
//!
//! A hand-written vfork-style spawn: `clone(CLONE_VM | CLONE_VFORK)` runs [`child_main`] on a
//! stack of its own, sharing our memory while the calling thread is suspended, and the child
//! prepares itself and execs the hook. Everything it needs (argv, envp, descriptors, limits) is
//! built before the clone; the child only makes system calls. In the child, in this order:
//!
//! 1. every signal's disposition back to `SIG_DFL` (so no handler of the host can run on the
//!    shared memory, and nothing the host ignores stays ignored in the hook);
//! 2. its own process group (`setpgid(0, 0)`);
//! 3. `PR_SET_PDEATHSIG(SIGKILL)`, then a check that its parent is still the host (the race
//!    against the host dying before the `prctl`);
//! 4. the rlimits; 5. into the run's cgroup (writing `0` to `cgroup.procs`);
//! 6. `fchdir` to the working directory the host opened and checked just before;
//! 7. stdin, stdout, stderr; 8. every other descriptor closed (`close_range(3, ~0)`), whatever
//!    the host inherited without `FD_CLOEXEC`;
//! 9. an empty signal mask (the host's threads block INT/TERM/HUP/PIPE; the mask survives exec);
//! 10. `execve`. A failure before exec is written to memory the parent reads after the clone
//!     returns (shared memory: no error pipe), and becomes `spawn failed: <what>: <errno>`.
//!
//! Why not the alternatives (measured in `benches/spawn.rs`): std's `Command` passes the
//! calling thread's signal mask and leaks inherited descriptors; `posix_spawn` can reset the
//! mask and close descriptors (glibc ≥ 2.34) but cannot set `PDEATHSIG`, rlimits or a cgroup;
//! `fork` (std with `pre_exec`) can do all of it but copies the host's page tables and makes
//! every page the agent then writes fault and copy once — the emit path's ring included. This
//! path does what glibc's own `posix_spawn` does (the same clone flags) plus those three steps.
//!
//! PDEATHSIG fires when the *thread* that spawned the child exits, not the process. Every hook
//! of a sink is spawned by its runner thread (`run_once` hands its spawns to it), which lives
//! until the sink has killed and reaped every process it started.

use super::env::ChildEnv;
use crate::config::Action;
use nix::libc;
use std::ffi::{CString, c_int, c_void};
use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Instant, SystemTime};

/// Resource limits for hook processes (`setrlimit`, soft = hard = the value), applied in the
/// child before it execs. Unset fields are left as the host has them. Lowering a hard limit is
/// always allowed; raising one above the host's needs privileges, and a refused limit fails
/// the spawn (counted as `spawn_failed`, never run unlimited).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Rlimits {
    /// RLIMIT_CPU, seconds of CPU time; set with soft = hard, so at the limit the kernel sends
    /// SIGKILL (no SIGXCPU first).
    pub cpu_seconds: Option<u64>,
    /// RLIMIT_AS, bytes of address space (breaks JVMs and Node, which reserve far more than
    /// they use; not offered in hooks.json).
    pub address_space_bytes: Option<u64>,
    /// RLIMIT_NOFILE, open file descriptors.
    pub open_files: Option<u64>,
    /// RLIMIT_NPROC, processes of the *user* (not of the hook; not enforced for root; not
    /// offered in hooks.json).
    pub processes: Option<u64>,
    /// RLIMIT_FSIZE, bytes of the largest file written.
    pub file_size_bytes: Option<u64>,
    /// RLIMIT_CORE, bytes of core dump (0 disables core dumps).
    pub core_bytes: Option<u64>,
}

impl Rlimits {
    pub(crate) fn list(&self) -> Vec<Rlimit> {
        [
            (libc::RLIMIT_CPU, "RLIMIT_CPU", self.cpu_seconds),
            (libc::RLIMIT_AS, "RLIMIT_AS", self.address_space_bytes),
            (libc::RLIMIT_NOFILE, "RLIMIT_NOFILE", self.open_files),
            (libc::RLIMIT_NPROC, "RLIMIT_NPROC", self.processes),
            (libc::RLIMIT_FSIZE, "RLIMIT_FSIZE", self.file_size_bytes),
            (libc::RLIMIT_CORE, "RLIMIT_CORE", self.core_bytes),
        ]
        .into_iter()
        .filter_map(|(resource, name, v)| {
            v.map(|value| Rlimit {
                resource: resource as c_int,
                name,
                value,
            })
        })
        .collect()
    }
}

/// One limit as the child applies it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Rlimit {
    resource: c_int,
    name: &'static str,
    value: u64,
}

/// What every spawn of one sink shares.
pub(crate) struct SpawnOpts {
    /// `/dev/null`, read-write, close-on-exec, at fd ≥ 3.
    dev_null: OwnedFd,
    /// The workspace (absolute and canonical forms) and a descriptor of it: a hook's `cwd`
    /// inside it is opened beneath this descriptor at every spawn.
    workspace: Vec<PathBuf>,
    workspace_fd: Option<OwnedFd>,
    /// The child's stack, reused (one spawn at a time per sink: the runner's).
    stack: Mutex<ChildStack>,
    /// The descriptor limit the fallback for kernels without `close_range` closes up to.
    max_fd: c_int,
}

impl SpawnOpts {
    pub(crate) fn new(workspace: &Path) -> std::io::Result<SpawnOpts> {
        let dev_null = above_stdio(File::options().read(true).write(true).open("/dev/null")?)?;
        let mut paths = vec![std::path::absolute(workspace)?];
        if let Ok(canon) = std::fs::canonicalize(workspace)
            && canon != paths[0]
        {
            paths.push(canon);
        }
        // A workspace that does not exist (yet) has no descriptor; its hooks' cwds are then
        // opened by path, and checked the same way.
        let workspace_fd = open_dir(libc::AT_FDCWD, &paths[0]).ok();
        let max_fd = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
            .map(|(soft, _)| soft.min(1 << 20) as c_int)
            .unwrap_or(1024);
        Ok(SpawnOpts {
            dev_null,
            workspace: paths,
            workspace_fd,
            stack: Mutex::new(ChildStack::new()?),
            max_fd,
        })
    }

    /// Opens `cwd` for the child's `fchdir`. A cwd inside the workspace must still resolve
    /// inside it now, checked on the descriptor the child will use (so a directory swapped for
    /// a symlink to `/etc` after the table was loaded is refused, and nothing can be swapped
    /// between the check and the `fchdir`): `openat2` with `RESOLVE_BENEATH` from the
    /// workspace's descriptor, or — for what that refuses but the loader allows, an absolute
    /// symlink that stays inside — where the kernel says the opened directory really is.
    fn open_cwd(&self, cwd: &Path) -> Result<OwnedFd, String> {
        let inside = self
            .workspace
            .iter()
            .find_map(|ws| cwd.strip_prefix(ws).ok().map(|rel| (ws, rel)));
        let fail = |e: std::io::Error| format!("cwd {}: {e}", cwd.display());
        let (Some(ws_fd), Some((ws, rel))) = (&self.workspace_fd, inside) else {
            // Outside the workspace: only a table built by hand (the loader refuses it).
            return open_dir(libc::AT_FDCWD, cwd).map_err(fail);
        };
        match open_beneath(ws_fd.as_raw_fd(), rel) {
            Ok(fd) => return Ok(fd),
            Err(e) if matches!(e.raw_os_error(), Some(libc::EXDEV | libc::ENOSYS)) => {}
            Err(e) => return Err(fail(e)),
        }
        let fd = open_dir(libc::AT_FDCWD, cwd).map_err(fail)?;
        let real = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))
            .map_err(|e| format!("cwd {}: cannot tell where it leads: {e}", cwd.display()))?;
        if self.workspace.iter().any(|w| real.starts_with(w)) {
            Ok(fd)
        } else {
            Err(format!(
                "cwd {} now resolves outside the workspace {} (to {}); not run",
                cwd.display(),
                ws.display(),
                real.display()
            ))
        }
    }
}

/// A hook process that has started: its pid, its pipes.
pub(crate) struct Spawned {
    pub(crate) pid: u32,
    /// `None` when the kernel has no `pidfd_open` (before 5.3) or forbids it; the reactor then
    /// polls `waitpid(pid, WNOHANG)` on a short tick instead.
    pub(crate) pidfd: Option<OwnedFd>,
    pub(crate) stdin: Option<File>,
    /// Only with [`Request::capture_stdout`] (hooks' stdout goes to `/dev/null`).
    pub(crate) stdout: Option<File>,
    pub(crate) stderr: Option<File>,
    pub(crate) started: Instant,
    pub(crate) started_at: SystemTime,
}

/// What the child needs, all prepared by the parent (the child only reads it, and writes
/// `error`).
#[repr(C)]
struct ChildArgs {
    program: *const libc::c_char,
    argv: *const *const libc::c_char,
    envp: *const *const libc::c_char,
    /// Source descriptors for 0, 1, 2 (all ≥ 3, so no dup2 clobbers another).
    stdio: [RawFd; 3],
    cwd: RawFd,
    /// `cgroup.procs` of the run's cgroup, or -1.
    cgroup_procs: RawFd,
    rlimits: *const Rlimit,
    rlimits_len: usize,
    /// The host's pid: if the child's parent is no longer it, the host died before PDEATHSIG
    /// was armed.
    parent: libc::pid_t,
    max_fd: c_int,
    /// Written by the child before it gives up: which step failed and its errno.
    error: ChildError,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct ChildError {
    step: c_int,
    errno: c_int,
    /// For `STEP_RLIMIT`: which limit.
    index: usize,
}

const STEP_NONE: c_int = 0;
const STEP_PGID: c_int = 1;
const STEP_PDEATHSIG: c_int = 2;
const STEP_RLIMIT: c_int = 3;
const STEP_CGROUP: c_int = 4;
const STEP_CWD: c_int = 5;
const STEP_STDIO: c_int = 6;
const STEP_CLOSE: c_int = 7;
const STEP_MASK: c_int = 8;
const STEP_EXEC: c_int = 9;
const STEP_ORPHANED: c_int = 10;

/// What one spawn needs beyond the action.
pub(crate) struct Request<'a> {
    pub(crate) env: &'a ChildEnv,
    pub(crate) rlimits: &'a [Rlimit],
    /// `cgroup.procs` of the run's cgroup.
    pub(crate) cgroup_procs: Option<RawFd>,
    /// Whether stdout is a pipe the caller reads (command policies' answers) rather than
    /// `/dev/null`.
    pub(crate) capture_stdout: bool,
}

/// Starts `action`. Errors are the `spawn failed: …` reason.
pub(crate) fn spawn(action: &Action, req: &Request, opts: &SpawnOpts) -> Result<Spawned, String> {
    let program_path = action.program.as_ref().map_err(Clone::clone)?;
    let shown = || program_path.display().to_string();
    let (program, args) = c_args(program_path, action)?;
    let argv: Vec<*const libc::c_char> = args
        .iter()
        .map(|a| a.as_ptr())
        .chain(std::iter::once(std::ptr::null()))
        .collect();
    let envp = req.env.pointers();

    let cwd = opts.open_cwd(&action.cwd)?;
    let io_err = |what: &str, e: std::io::Error| format!("{what}: {e}");
    let (stdin_ours, stdin_theirs) = if action.stdin_json {
        let (r, w) = pipe().map_err(|e| io_err("stdin pipe", e))?;
        (Some(File::from(w)), Some(r))
    } else {
        (None, None)
    };
    let (stdout_ours, stdout_theirs) = if req.capture_stdout {
        let (r, w) = pipe().map_err(|e| io_err("stdout pipe", e))?;
        (Some(File::from(r)), Some(w))
    } else {
        (None, None)
    };
    let (stderr_r, stderr_w) = pipe().map_err(|e| io_err("stderr pipe", e))?;
    let null = opts.dev_null.as_raw_fd();
    let mut child = ChildArgs {
        program: program.as_ptr(),
        argv: argv.as_ptr(),
        envp: envp.as_ptr(),
        stdio: [
            stdin_theirs.as_ref().map_or(null, |f| f.as_raw_fd()),
            stdout_theirs.as_ref().map_or(null, |f| f.as_raw_fd()),
            stderr_w.as_raw_fd(),
        ],
        cwd: cwd.as_raw_fd(),
        cgroup_procs: req.cgroup_procs.unwrap_or(-1),
        rlimits: req.rlimits.as_ptr(),
        rlimits_len: req.rlimits.len(),
        // SAFETY: getpid(2) has no preconditions.
        parent: unsafe { libc::getpid() },
        max_fd: opts.max_fd,
        error: ChildError {
            step: STEP_NONE,
            errno: 0,
            index: 0,
        },
    };

    let started = Instant::now();
    let started_at = SystemTime::now();
    let pid = {
        let stack = super::lock(&opts.stack);
        // Leaders the CLI's orphan reaper must leave to us are registered before the
        // reaper can see them (a no-op in a library host).
        let registering = super::supervisor::Registering::begin();
        let pid = clone_child(&stack, &mut child);
        registering.insert(pid);
        pid
    };
    if pid < 0 {
        return Err(format!(
            "{}: clone: {}",
            shown(),
            std::io::Error::last_os_error()
        ));
    }
    // SAFETY: reading back what the child wrote; it has exec'd or exited (CLONE_VFORK), so
    // nothing writes `error` any more.
    let error = unsafe { std::ptr::read_volatile(&child.error) };
    drop((stdin_theirs, stdout_theirs, stderr_w, cwd));
    if error.step != STEP_NONE {
        // It exited without exec'ing: reap it now, it is ours.
        reap_blocking(pid);
        return Err(child_error(&error, action, req, &shown()));
    }
    let pidfd = pidfd_open(pid as u32);
    let stderr = File::from(stderr_r);
    set_nonblocking(stderr.as_raw_fd());
    if let Some(p) = &stdin_ours {
        set_nonblocking(p.as_raw_fd());
    }
    if let Some(p) = &stdout_ours {
        set_nonblocking(p.as_raw_fd());
    }
    Ok(Spawned {
        pid: pid as u32,
        pidfd,
        stdin: stdin_ours,
        stdout: stdout_ours,
        stderr: Some(stderr),
        started,
        started_at,
    })
}

/// The program and the argument vector (the program first), as C strings.
fn c_args(program_path: &Path, action: &Action) -> Result<(CString, Vec<CString>), String> {
    let cstr =
        |b: &[u8], what: &str| CString::new(b).map_err(|_| format!("{} contains a NUL byte", what));
    let program = cstr(program_path.as_os_str().as_bytes(), "the program path")?;
    let mut args = Vec::with_capacity(action.args.len() + 1);
    args.push(program.clone());
    for a in &action.args {
        args.push(cstr(a.as_bytes(), "an argument")?);
    }
    Ok((program, args))
}

/// The reason a child that exited without exec'ing gave, by the step it failed at.
fn child_error(error: &ChildError, action: &Action, req: &Request, shown: &str) -> String {
    let e = std::io::Error::from_raw_os_error(error.errno);
    match error.step {
        STEP_CWD => format!("cwd {}: {e}", action.cwd.display()),
        STEP_EXEC => format!("{shown}: {e}"),
        STEP_RLIMIT => {
            let name = req.rlimits.get(error.index).map_or("?", |r| r.name);
            format!("{shown}: setrlimit {name}: {e}")
        }
        STEP_CGROUP => format!("{shown}: moving it into its cgroup: {e}"),
        STEP_ORPHANED => "the host process is exiting".to_string(),
        step => format!("{shown}: preparing the child (step {step}): {e}"),
    }
}

/// Runs the clone with every signal blocked on this thread (restored right after), so that
/// no handler of the host runs in the child before it has reset the dispositions.
fn clone_child(stack: &ChildStack, child: &mut ChildArgs) -> libc::pid_t {
    // SAFETY: sigset operations on locals; pthread_sigmask on the calling thread.
    let mut old: libc::sigset_t = unsafe { std::mem::zeroed() };
    unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
    }
    // SAFETY: `child_main` only makes system calls on memory prepared above and kept alive
    // until clone returns (CLONE_VFORK: this thread is suspended until the child has exec'd
    // or exited, so `child`, the argv/envp arrays and the strings they point to outlive every
    // use). The stack is ours alone for the same reason (the lock is held). Without
    // CLONE_THREAD the child is a process of its own: its exit ends only itself.
    let pid = unsafe {
        libc::clone(
            child_main,
            stack.top(),
            libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
            (child as *mut ChildArgs).cast::<c_void>(),
        )
    };
    let clone_errno = std::io::Error::last_os_error();
    // SAFETY: restoring this thread's mask saved above.
    unsafe {
        libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
    }
    if pid < 0 {
        // Keep the clone's errno for the caller's `last_os_error`.
        // SAFETY: writing this thread's errno.
        unsafe { *libc::__errno_location() = clone_errno.raw_os_error().unwrap_or(0) };
    }
    pid
}

/// The child, between clone and exec. Runs on [`ChildStack`], in the host's memory, with every
/// signal blocked: only raw system calls (async-signal-safe), no allocation, no locks, no
/// panics (no indexing; every step returns on failure). Returns only on failure (the clone
/// wrapper then ends the child with that status).
extern "C" fn child_main(arg: *mut c_void) -> c_int {
    // SAFETY: `arg` is the `ChildArgs` the parent passed to clone, alive and unaliased while
    // the parent is suspended; each pointer in it was built from live CStrings / slices.
    unsafe {
        let a = &mut *arg.cast::<ChildArgs>();
        let fail = |a: &mut ChildArgs, step: c_int, index: usize| -> c_int {
            let error = ChildError {
                step,
                errno: *libc::__errno_location(),
                index,
            };
            std::ptr::write_volatile(&mut a.error, error);
            127
        };
        // 1. Default dispositions: an all-zero kernel sigaction is SIG_DFL with no flags and
        //    an empty mask on every architecture. The raw call also resets the C library's
        //    reserved real-time signals, which its wrapper refuses.
        let dfl = [0u64; 4];
        for sig in 1..=64 {
            if sig != libc::SIGKILL && sig != libc::SIGSTOP {
                libc::syscall(
                    libc::SYS_rt_sigaction,
                    sig,
                    dfl.as_ptr(),
                    std::ptr::null_mut::<c_void>(),
                    8usize,
                );
            }
        }
        // 2. A process group of its own: killed as one.
        if libc::setpgid(0, 0) != 0 {
            return fail(a, STEP_PGID, 0);
        }
        // 3. Dies with the host's spawning thread; if the host already died, it would never
        //    get the signal: give up.
        if libc::prctl(
            libc::PR_SET_PDEATHSIG,
            libc::SIGKILL as libc::c_ulong,
            0,
            0,
            0,
        ) != 0
        {
            return fail(a, STEP_PDEATHSIG, 0);
        }
        if libc::getppid() != a.parent {
            return fail(a, STEP_ORPHANED, 0);
        }
        // 4. Limits.
        for i in 0..a.rlimits_len {
            let r = &*a.rlimits.add(i);
            let lim = libc::rlimit {
                rlim_cur: r.value as libc::rlim_t,
                rlim_max: r.value as libc::rlim_t,
            };
            if libc::setrlimit(r.resource as _, &lim) != 0 {
                return fail(a, STEP_RLIMIT, i);
            }
        }
        // 5. Into the run's cgroup before any code of the hook runs ("0": the writer).
        if a.cgroup_procs >= 0 && libc::write(a.cgroup_procs, b"0".as_ptr().cast(), 1) != 1 {
            return fail(a, STEP_CGROUP, 0);
        }
        // 6. The working directory the parent opened and checked.
        if libc::fchdir(a.cwd) != 0 {
            return fail(a, STEP_CWD, 0);
        }
        // 7. stdio (sources are ≥ 3: no dup2 here overwrites a later source).
        let stdio = a.stdio;
        for (target, &source) in stdio.iter().enumerate() {
            if libc::dup2(source, target as c_int) < 0 {
                return fail(a, STEP_STDIO, target);
            }
        }
        // 8. Nothing above stderr reaches the hook (errors travel through memory, so closing
        //    outright is fine).
        if libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, 0u32) != 0 {
            if *libc::__errno_location() != libc::ENOSYS {
                return fail(a, STEP_CLOSE, 0);
            }
            for fd in 3..a.max_fd {
                libc::close(fd);
            }
        }
        // 9. An empty mask, whatever the host's threads block.
        let empty = 0u64;
        if libc::syscall(
            libc::SYS_rt_sigprocmask,
            libc::SIG_SETMASK,
            &empty as *const u64,
            std::ptr::null_mut::<c_void>(),
            8usize,
        ) != 0
        {
            return fail(a, STEP_MASK, 0);
        }
        // 10.
        libc::execve(a.program, a.argv, a.envp);
        fail(a, STEP_EXEC, 0)
    }
}

/// The child's stack: 256 KiB of anonymous memory with a guard page below it (an overflow
/// faults instead of writing into the heap).
struct ChildStack {
    base: *mut c_void,
    len: usize,
}

// SAFETY: the mapping is plain memory owned by this value; access is serialized by the Mutex
// that holds it.
unsafe impl Send for ChildStack {}

const STACK_BYTES: usize = 256 * 1024;

impl ChildStack {
    fn new() -> std::io::Result<ChildStack> {
        let page = 4096usize.max(
            nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
                .ok()
                .flatten()
                .unwrap_or(4096) as usize,
        );
        let len = STACK_BYTES + page;
        // SAFETY: an anonymous private mapping; checked below.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_STACK,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: the lowest page of the mapping just made.
        if unsafe { libc::mprotect(base, page, libc::PROT_NONE) } != 0 {
            let e = std::io::Error::last_os_error();
            // SAFETY: unmapping what we mapped.
            unsafe { libc::munmap(base, len) };
            return Err(e);
        }
        Ok(ChildStack { base, len })
    }

    /// The highest address, 16-byte aligned (stacks grow down on every Linux target we build).
    fn top(&self) -> *mut c_void {
        let end = self.base as usize + self.len;
        (end & !15) as *mut c_void
    }
}

impl Drop for ChildStack {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`; no child runs on it (spawns hold the lock).
        unsafe { libc::munmap(self.base, self.len) };
    }
}

/// Waits for a child that exited before exec.
fn reap_blocking(pid: libc::pid_t) {
    let mut status = 0;
    // SAFETY: waitpid on our own unreaped child.
    while unsafe { libc::waitpid(pid, &mut status, 0) } < 0
        && std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR)
    {}
    super::supervisor::unregister(pid);
}

/// A close-on-exec pipe: (read end, write end), both at fd ≥ 3.
fn pipe() -> std::io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as RawFd; 2];
    // SAFETY: pipe2 writes two fresh descriptors into `fds`.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: both are fresh descriptors nobody else owns.
    let (r, w) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    Ok((above_stdio(r)?, above_stdio(w)?))
}

/// `fd` itself if it is ≥ 3, else a close-on-exec duplicate at ≥ 3 (a host that closed its
/// stdin would otherwise get pipes at 0–2, and the child's dup2s would clobber them).
fn above_stdio(fd: impl Into<OwnedFd>) -> std::io::Result<OwnedFd> {
    let fd: OwnedFd = fd.into();
    if fd.as_raw_fd() > 2 {
        return Ok(fd);
    }
    // SAFETY: F_DUPFD_CLOEXEC on a descriptor we own returns a new one or -1.
    let dup = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 3) };
    if dup < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(dup) })
}

/// A directory opened for `fchdir` only (`O_PATH`: no read permission needed, nothing read).
fn open_dir(at: RawFd, path: &Path) -> std::io::Result<OwnedFd> {
    let c = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: openat with a valid C string; returns a new descriptor or -1.
    let fd = unsafe {
        libc::openat(
            at,
            c.as_ptr(),
            libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor nobody else owns.
    above_stdio(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// `rel` opened beneath `dir`: every component, symlinks included, must stay inside it
/// (`EXDEV` otherwise); `ENOSYS` before Linux 5.6.
fn open_beneath(dir: RawFd, rel: &Path) -> std::io::Result<OwnedFd> {
    let rel = if rel.as_os_str().is_empty() {
        Path::new(".")
    } else {
        rel
    };
    let c = CString::new(rel.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: open_how is plain data; zeroed then filled.
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = (libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC) as u64;
    how.resolve = libc::RESOLVE_BENEATH | libc::RESOLVE_NO_MAGICLINKS;
    // SAFETY: openat2(2) with a valid C string and a live open_how of the size passed.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            dir,
            c.as_ptr(),
            &how as *const libc::open_how,
            std::mem::size_of::<libc::open_how>(),
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor nobody else owns.
    above_stdio(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

fn pidfd_open(pid: u32) -> Option<OwnedFd> {
    // SAFETY: pidfd_open(2) takes a pid and flags and returns a new fd (O_CLOEXEC) or -1. The
    // child is ours and unreaped, so its pid cannot have been reused.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    if fd < 0 {
        static WARNED: std::sync::Once = std::sync::Once::new();
        WARNED.call_once(|| {
            tracing::warn!(
                "pidfd_open failed ({}); hook processes are polled every few ms instead",
                std::io::Error::last_os_error()
            )
        });
        return None;
    }
    // SAFETY: a fresh fd nobody else owns.
    Some(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

pub(crate) fn set_nonblocking(fd: RawFd) {
    // SAFETY: fcntl on an fd we own, with integer arguments.
    unsafe {
        let flags = libc::fcntl(fd, libc::F_GETFL);
        if flags >= 0 {
            libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK);
        }
    }
}
