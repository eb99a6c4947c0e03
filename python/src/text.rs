//! Borrowing a Python `str`'s UTF-8 text without copying it.
//!
//! PyO3 borrows `&str` only where `PyUnicode_AsUTF8AndSize` is in the limited API (3.10+);
//! for abi3-py39 it encodes a new `bytes` object on every call, which would be most of an
//! emit's cost. The function itself is exported, with the same signature and meaning, by
//! every CPython 3 since 3.3, so it is declared here and called on 3.9 too.

use pyo3::exceptions::PyTypeError;
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::PyString;
use std::os::raw::c_char;

unsafe extern "C" {
    #[link_name = "PyUnicode_AsUTF8AndSize"]
    fn as_utf8_and_size(unicode: *mut ffi::PyObject, size: *mut ffi::Py_ssize_t) -> *const c_char;
}

/// Why a str has no UTF-8 text.
pub(crate) struct Unencodable;

/// The UTF-8 text of `s`, borrowed from it: for an ASCII string its own data, else the UTF-8
/// copy CPython caches in the object. `Err` for a string holding a lone surrogate (which
/// UTF-8, and so JSON text, cannot hold); the Python error is cleared.
#[inline]
pub(crate) fn utf8<'a>(s: &'a Bound<'_, PyString>) -> Result<&'a str, Unencodable> {
    let mut len: ffi::Py_ssize_t = 0;
    // SAFETY: `s` is a live str (the type guarantees it) and we hold the GIL (`Bound`).
    let ptr = unsafe { as_utf8_and_size(s.as_ptr(), &mut len) };
    if ptr.is_null() {
        // A UnicodeEncodeError (lone surrogate): ours to report differently.
        drop(PyErr::take(s.py()));
        return Err(Unencodable);
    }
    // SAFETY: CPython returned `len` bytes of valid UTF-8 (it encodes strictly), owned by `s`
    // (its data or its cached UTF-8), alive and unchanged while `s` is (strings are
    // immutable); the returned borrow is tied to `s`.
    Ok(unsafe {
        std::str::from_utf8_unchecked(std::slice::from_raw_parts(ptr.cast::<u8>(), len as usize))
    })
}

/// The text of an exact `str` (not a subclass) that UTF-8 can hold, else `None`: the emit
/// path's first try, a pointer comparison and one call; everything else goes the slow way.
#[inline(always)]
pub(crate) fn exact_str<'a>(v: &'a Bound<'_, PyAny>) -> Option<&'a str> {
    // SAFETY: reading the type of a live object (we hold the GIL) is what `Py_TYPE` is for;
    // `PyUnicode_Type` is only compared by address.
    let exact = unsafe { ffi::Py_TYPE(v.as_ptr()) == std::ptr::addr_of_mut!(ffi::PyUnicode_Type) };
    if !exact {
        return None;
    }
    // SAFETY: `v` is an exact str.
    utf8(unsafe { v.cast_unchecked::<PyString>() }).ok()
}

/// A `str` argument's text; `name` names the argument in the TypeError.
#[inline(always)]
pub(crate) fn str_arg<'a>(v: &'a Bound<'_, PyAny>, name: &str) -> PyResult<&'a str> {
    match exact_str(v) {
        Some(s) => Ok(s),
        None => str_arg_slow(v, name),
    }
}

/// `str_arg` for subclasses of str, and the errors.
#[cold]
#[inline(never)]
fn str_arg_slow<'a>(v: &'a Bound<'_, PyAny>, name: &str) -> PyResult<&'a str> {
    match v.cast::<PyString>() {
        Ok(s) => utf8(s).map_err(|Unencodable| surrogate_error(name)),
        Err(_) => Err(PyTypeError::new_err(format!(
            "{name}: expected str, got {}",
            type_name(v)
        ))),
    }
}

pub(crate) fn surrogate_error(name: &str) -> PyErr {
    PyTypeError::new_err(format!(
        "{name}: str holds a lone surrogate (like '\\ud800'), which UTF-8 and JSON text cannot hold"
    ))
}

/// `type(v).__name__`.
pub(crate) fn type_name(v: &Bound<'_, PyAny>) -> String {
    v.get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "object".into())
}
