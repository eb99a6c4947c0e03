//! The exceptions raised with the library's messages. The classes are defined in Python
//! (`prx_hooks/errors.py`: some derive from two built-ins, which a class made here could not
//! do as simply) and looked up once.

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyType;

macro_rules! exceptions {
    ($($fn_name:ident => $class:literal),* $(,)?) => {$(
        pub(crate) fn $fn_name(msg: impl Into<String>) -> PyErr {
            let msg = msg.into();
            Python::attach(|py| {
                static CLASS: PyOnceLock<Py<PyType>> = PyOnceLock::new();
                match CLASS.import(py, "prx_hooks.errors", $class) {
                    Ok(class) => PyErr::from_type(class.clone(), msg),
                    Err(e) => e,
                }
            })
        }
    )*};
}

exceptions! {
    build_error => "BuildError",
    extras_error => "ExtrasError",
    bus_error => "BusError",
    closed_error => "ClosedError",
    fork_error_class => "ForkError",
    decide_error => "DecideError",
}

/// The error of an object made before a fork, used in the child.
pub(crate) fn fork_error(what: &str) -> PyErr {
    fork_error_class(format!(
        "this {what} was made in the parent of this process, before os.fork(): its threads are \
         not in this process, so it cannot work here; make a new prx_hooks.Hooks in the child \
         (after the fork: multiprocessing's initializer, gunicorn's post_fork), or start \
         processes with the \"spawn\" or \"forkserver\" method"
    ))
}
