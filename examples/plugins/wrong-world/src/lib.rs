//! `wrong-world`: a TEST-ONLY component that exports `prx:plugin/hook-exports@0.1.0` with an
//! `on-event` of the wrong type (`func(event: string) -> u32`) and imports nothing from
//! `prx:host`. The host must reject it with a clear error. Build with `examples/build-plugins.sh`.

wit_bindgen::generate!({
    path: "wit",
    world: "wrong-world",
});

use exports::prx::plugin::hook_exports::Guest;

struct WrongWorld;

impl Guest for WrongWorld {
    fn on_event(event: String) -> u32 {
        event.len() as u32
    }
}

export!(WrongWorld);
