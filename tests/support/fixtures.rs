//! The agents' documented sample payloads, `tests/fixtures/agents/<agent>/<event>.json`.

use prx_hooks::agents::Agent;
use std::path::PathBuf;

/// The fixture's JSON (its `//` comment lines removed) and the page it cites.
pub fn fixture(agent: Agent, event: &str) -> (String, String) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/agents")
        .join(agent.name())
        .join(format!("{event}.json"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (every documented event has a fixture)",
            path.display()
        )
    });
    let source = text
        .lines()
        .find_map(|l| l.strip_prefix("// source: "))
        .unwrap_or_else(|| panic!("{}: no `// source:` line", path.display()))
        .to_string();
    let json: Vec<&str> = text.lines().filter(|l| !l.starts_with("//")).collect();
    (json.join("\n"), source)
}
