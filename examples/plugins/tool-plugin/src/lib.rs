//! `tool-plugin`: a TEST-ONLY component built for PRX's `tool` world (it exports
//! `prx:plugin/tool-exports@0.1.0`, not `hook-exports`). A PRX plugins folder holds such plugins
//! beside hooks; prx-hooks must skip them, not refuse the folder. Build with
//! `examples/build-plugins.sh`.

wit_bindgen::generate!({
    path: "wit",
    world: "tool",
});

use exports::prx::plugin::tool_exports::{Guest, PluginResult, ToolSpec};

struct Tool;

impl Guest for Tool {
    fn get_spec() -> ToolSpec {
        ToolSpec {
            name: "echo".into(),
            description: "Echoes its arguments".into(),
            parameters_schema: r#"{"type":"object"}"#.into(),
        }
    }

    fn execute(args: String) -> PluginResult {
        PluginResult {
            success: true,
            output: args,
            error: None,
        }
    }
}

export!(Tool);
