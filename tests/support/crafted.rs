//! Components encoded by hand for the WASM tests: shapes a hostile author can build and no guest
//! toolchain in this repo emits. Each is a complete `hook`-world component: it exports
//! `prx:plugin/hook-exports@0.1.0` with `on-event: func(event: string, payload-json: string) ->
//! result<_, string>`, which returns `Ok(())`.

#![allow(dead_code)] // each test binary uses a different subset

use wasm_encoder::{
    CanonicalOption, CodeSection, ComponentBuilder, ComponentExportKind, ComponentTypeRef,
    ComponentValType, ConstExpr, ExportKind, ExportSection, Function, FunctionSection,
    GlobalSection, GlobalType, Instruction as I, MemArg, MemorySection, MemoryType, Module,
    PrimitiveValType, TypeSection, ValType,
};

fn one_page() -> MemoryType {
    MemoryType {
        minimum: 1,
        maximum: None,
        memory64: false,
        shared: false,
        page_size_log2: None,
    }
}

/// The core module behind `on-event`: its memory, a bump `cabi_realloc`, and `on-event`, which
/// writes the `ok` discriminant at address 16 and returns that address.
fn main_module() -> Module {
    let mut m = Module::new();
    let mut types = TypeSection::new();
    types.ty().function([ValType::I32; 4], [ValType::I32]);
    m.section(&types);
    let mut funcs = FunctionSection::new();
    funcs.function(0).function(0);
    m.section(&funcs);
    let mut mems = MemorySection::new();
    mems.memory(one_page());
    m.section(&mems);
    let mut globals = GlobalSection::new();
    globals.global(
        GlobalType {
            val_type: ValType::I32,
            mutable: true,
            shared: false,
        },
        &ConstExpr::i32_const(1024),
    );
    m.section(&globals);
    let mut exports = ExportSection::new();
    exports
        .export("memory", ExportKind::Memory, 0)
        .export("on-event", ExportKind::Func, 0)
        .export("cabi_realloc", ExportKind::Func, 1);
    m.section(&exports);
    let mut code = CodeSection::new();
    let mut on_event = Function::new([]);
    for i in [
        I::I32Const(16),
        I::I32Const(0),
        I::I32Store8(MemArg {
            offset: 0,
            align: 0,
            memory_index: 0,
        }),
        I::I32Const(16),
        I::End,
    ] {
        on_event.instruction(&i);
    }
    code.function(&on_event);
    // realloc(old, old_size, align, new_size): from a bump pointer kept 8-aligned, starting
    // over at 1024 when the first page would overflow (arguments are small).
    let mut realloc = Function::new([]);
    for i in [
        I::GlobalGet(0),
        I::LocalGet(3),
        I::I32Add,
        I::I32Const(60_000),
        I::I32GtU,
        I::If(wasm_encoder::BlockType::Empty),
        I::I32Const(1024),
        I::GlobalSet(0),
        I::End,
        I::GlobalGet(0),
        I::GlobalGet(0),
        I::LocalGet(3),
        I::I32Add,
        I::I32Const(7),
        I::I32Add,
        I::I32Const(-8),
        I::I32And,
        I::GlobalSet(0),
        I::End,
    ] {
        realloc.instruction(&i);
    }
    code.function(&realloc);
    m.section(&code);
    m
}

/// A module that only defines (and exports) a memory of one page.
fn memory_module() -> Module {
    let mut m = Module::new();
    let mut mems = MemorySection::new();
    mems.memory(one_page());
    m.section(&mems);
    let mut exports = ExportSection::new();
    exports.export("m", ExportKind::Memory, 0);
    m.section(&exports);
    m
}

/// `(event: string, payload-json: string) -> result<_, string>` in `b`.
fn on_event_type(b: &mut ComponentBuilder) -> u32 {
    let string = ComponentValType::Primitive(PrimitiveValType::String);
    let (result, enc) = b.type_defined(None);
    enc.result(None, Some(string));
    let (func, mut enc) = b.type_function(None);
    enc.params([("event", string), ("payload-json", string)])
        .result(Some(ComponentValType::Type(result)));
    func
}

/// A hook component whose every instance has `memories` linear memories (one behind
/// `on-event`, the others in instances of a module that only defines one).
pub fn hook_with_memories(memories: u32) -> Vec<u8> {
    assert!(memories >= 1);
    let mut b = ComponentBuilder::default();
    let main = b.core_module(Some("main"), &main_module());
    let mem = b.core_module(Some("memory"), &memory_module());
    let inst = b.core_instantiate(Some("main"), main, []);
    for _ in 1..memories {
        b.core_instantiate(None, mem, []);
    }
    let memory = b.core_alias_export(None, inst, "memory", ExportKind::Memory);
    let realloc = b.core_alias_export(None, inst, "cabi_realloc", ExportKind::Func);
    let core_on_event = b.core_alias_export(None, inst, "on-event", ExportKind::Func);
    let ty = on_event_type(&mut b);
    let func = b.lift_func(
        Some("on-event"),
        core_on_event,
        ty,
        [
            CanonicalOption::UTF8,
            CanonicalOption::Memory(memory),
            CanonicalOption::Realloc(realloc),
        ],
    );
    // The interface instance: a nested component that takes the function and exports it.
    let mut inner = ComponentBuilder::default();
    let inner_ty = on_event_type(&mut inner);
    let f = inner.import("import-func-on-event", ComponentTypeRef::Func(inner_ty));
    inner.export("on-event", ComponentExportKind::Func, f, None);
    let inner = b.component(None, inner);
    let iface = b.instantiate(
        None,
        inner,
        [("import-func-on-event", ComponentExportKind::Func, func)],
    );
    b.export(
        "prx:plugin/hook-exports@0.1.0",
        ComponentExportKind::Instance,
        iface,
        None,
    );
    b.finish()
}
