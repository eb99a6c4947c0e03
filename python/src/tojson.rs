//! Compact JSON text straight from Python objects: what `arguments=` and `extras=` dicts
//! become, without a `json.dumps` round trip.
//!
//! The text is what `json.dumps(v, separators=(",", ":"), ensure_ascii=False,
//! allow_nan=False)` writes for the same value — same escapes, same float spelling (Python's
//! `repr`: shortest round trip, `1e+16`, `1.0`) — so a dict and its `json.dumps` text give a
//! hook the same bytes. It is stricter than `json.dumps` where JSON or the library is:
//! values JSON cannot hold are a `TypeError` naming the path to them, not a guess:
//!
//! * types other than dict, list, tuple, str, int, float, bool and None (and their
//!   subclasses), NaN and ±Infinity;
//! * keys that are not `str` (`json.dumps` would turn `1` into `"1"`, colliding with a key
//!   `"1"`), strings holding a lone surrogate (not UTF-8);
//! * a container inside itself, and nesting deeper than the library keeps (`arguments` 125
//!   levels, extras 126: the payload and the `--print` envelope around them stay within
//!   serde_json's 127).
//!
//! No Python code runs while it writes (no `__str__`, `__repr__`, `__iter__` or `__index__`
//! is called: ints are read with `PyLong_AsLongLongAndOverflow`, large ones written by
//! `PyNumber_ToBase`), so the objects cannot change under it.

use crate::text::{Unencodable, type_name, utf8};
use pyo3::exceptions::PyTypeError;
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyFloat, PyList, PyString, PyTuple};
use std::fmt::Write as _;

/// One step of the path to a refused value.
enum Step {
    Key(String),
    Index(usize),
}

/// A refused value: what is wrong, and the path to it (innermost step first).
pub(crate) struct Refusal {
    path: Vec<Step>,
    reason: String,
}

impl Refusal {
    fn new(reason: impl Into<String>) -> Refusal {
        Refusal {
            path: Vec::new(),
            reason: reason.into(),
        }
    }

    fn at(mut self, step: Step) -> Refusal {
        self.path.push(step);
        self
    }

    /// `TypeError: arguments["files"][2]: set is not JSON serializable`.
    pub(crate) fn into_err(self, root: &str) -> PyErr {
        let mut msg = root.to_string();
        for step in self.path.iter().rev() {
            match step {
                Step::Key(k) => {
                    msg.push('[');
                    string(&mut msg, k);
                    msg.push(']');
                }
                Step::Index(i) => {
                    let _ = write!(msg, "[{i}]");
                }
            }
        }
        let _ = write!(msg, ": {}", self.reason);
        PyTypeError::new_err(msg)
    }
}

/// Appends `v` as compact JSON to `out`; `max_depth` containers may nest (the outermost is 1).
pub(crate) fn write(
    out: &mut String,
    v: &Bound<'_, PyAny>,
    max_depth: usize,
) -> Result<(), Refusal> {
    let mut w = Writer {
        out,
        open: Vec::new(),
        max_depth,
    };
    w.value(v)
}

struct Writer<'o> {
    out: &'o mut String,
    /// The containers being written, outermost first (cycle check; its length is the depth).
    open: Vec<usize>,
    max_depth: usize,
}

impl Writer<'_> {
    fn value(&mut self, v: &Bound<'_, PyAny>) -> Result<(), Refusal> {
        if let Ok(s) = v.cast_exact::<PyString>() {
            return self.str(s);
        }
        if v.is_none() {
            self.out.push_str("null");
            return Ok(());
        }
        if let Ok(b) = v.cast_exact::<PyBool>() {
            self.out
                .push_str(if b.is_true() { "true" } else { "false" });
            return Ok(());
        }
        // SAFETY (all `ffi` type checks below): `v` is a live object and we hold the GIL.
        if unsafe { ffi::PyLong_Check(v.as_ptr()) } != 0 {
            return self.int(v);
        }
        if let Ok(f) = v.cast::<PyFloat>() {
            return float(self.out, f.value());
        }
        if let Ok(d) = v.cast::<PyDict>() {
            return self.dict(d);
        }
        if let Ok(l) = v.cast::<PyList>() {
            return self.array(v, l.len(), |i| l.get_item(i).ok());
        }
        if let Ok(t) = v.cast::<PyTuple>() {
            return self.array(v, t.len(), |i| t.get_item(i).ok());
        }
        if let Ok(s) = v.cast::<PyString>() {
            return self.str(s);
        }
        Err(Refusal::new(format!(
            "{} is not JSON serializable (dict, list, tuple, str, int, float, bool and None are)",
            type_name(v)
        )))
    }

    fn str(&mut self, s: &Bound<'_, PyString>) -> Result<(), Refusal> {
        match utf8(s) {
            Ok(text) => {
                string(self.out, text);
                Ok(())
            }
            Err(Unencodable) => Err(Refusal::new(
                "str holds a lone surrogate (like '\\ud800'), which UTF-8 and JSON text cannot hold",
            )),
        }
    }

    fn int(&mut self, v: &Bound<'_, PyAny>) -> Result<(), Refusal> {
        let mut overflow = 0;
        // SAFETY: `v` is an int (checked by the caller) and we hold the GIL; for an int this
        // reads the value without calling `__index__`.
        let n = unsafe { ffi::PyLong_AsLongLongAndOverflow(v.as_ptr(), &mut overflow) };
        if overflow == 0 && !(n == -1 && PyErr::occurred(v.py())) {
            self.out.push_str(itoa::Buffer::new().format(n));
            return Ok(());
        }
        drop(PyErr::take(v.py()));
        // Beyond 64 bits: int's own decimal text (never a subclass's `__str__`).
        // SAFETY: as above; the result is a new reference (or NULL with an error set).
        let text = unsafe { ffi::PyNumber_ToBase(v.as_ptr(), 10) };
        if text.is_null() {
            let e = PyErr::take(v.py()).map_or_else(|| "unknown error".into(), |e| e.to_string());
            return Err(Refusal::new(format!("int cannot be written: {e}")));
        }
        // SAFETY: a new, non-null reference, owned from here on.
        let text = unsafe { Bound::from_owned_ptr(v.py(), text) };
        match text.cast::<PyString>().ok().and_then(|s| utf8(s).ok()) {
            Some(t) => {
                self.out.push_str(t);
                Ok(())
            }
            None => Err(Refusal::new("int cannot be written")),
        }
    }

    /// Enters a container: refuses it if it is already open (a cycle) or too deep.
    fn enter(&mut self, v: &Bound<'_, PyAny>) -> Result<(), Refusal> {
        let id = v.as_ptr() as usize;
        if self.open.contains(&id) {
            return Err(Refusal::new(format!(
                "{} contains itself (a circular reference)",
                type_name(v)
            )));
        }
        if self.open.len() == self.max_depth {
            return Err(Refusal::new(format!(
                "nested more than {} levels deep",
                self.max_depth
            )));
        }
        self.open.push(id);
        Ok(())
    }

    fn dict(&mut self, d: &Bound<'_, PyDict>) -> Result<(), Refusal> {
        self.enter(d.as_any())?;
        self.out.push('{');
        let mut first = true;
        for (k, v) in d.iter() {
            let Ok(key) = k.cast::<PyString>() else {
                return Err(Refusal::new(format!(
                    "key {} ({}) is not a str (JSON object keys are strings)",
                    k.repr().map(|r| r.to_string()).unwrap_or_default(),
                    type_name(&k)
                )));
            };
            let Ok(key) = utf8(key) else {
                return Err(Refusal::new(
                    "a key holds a lone surrogate (like '\\ud800'), which UTF-8 and JSON text cannot hold",
                ));
            };
            if !first {
                self.out.push(',');
            }
            first = false;
            string(self.out, key);
            self.out.push(':');
            self.value(&v)
                .map_err(|r| r.at(Step::Key(key.to_string())))?;
        }
        self.out.push('}');
        self.open.pop();
        Ok(())
    }

    fn array<'py>(
        &mut self,
        v: &Bound<'py, PyAny>,
        len: usize,
        item: impl Fn(usize) -> Option<Bound<'py, PyAny>>,
    ) -> Result<(), Refusal> {
        self.enter(v)?;
        self.out.push('[');
        for i in 0..len {
            if i > 0 {
                self.out.push(',');
            }
            let Some(x) = item(i) else {
                return Err(Refusal::new("changed size while being written").at(Step::Index(i)));
            };
            self.value(&x).map_err(|r| r.at(Step::Index(i)))?;
        }
        self.out.push(']');
        self.open.pop();
        Ok(())
    }
}

/// A JSON string, escaped as Python's `json` module escapes with `ensure_ascii=False`: `"`,
/// `\`, and the control characters (`\n \r \t \b \f` by name, the others as `\u00XX`).
pub(crate) fn string(out: &mut String, s: &str) {
    out.reserve(s.len() + 2);
    out.push('"');
    let bytes = s.as_bytes();
    let mut start = 0;
    for (i, &b) in bytes.iter().enumerate() {
        let esc: &str = match b {
            b'"' => "\\\"",
            b'\\' => "\\\\",
            b'\n' => "\\n",
            b'\r' => "\\r",
            b'\t' => "\\t",
            0x08 => "\\b",
            0x0c => "\\f",
            0..=0x1f => "",
            _ => continue,
        };
        out.push_str(&s[start..i]);
        if esc.is_empty() {
            let _ = write!(out, "\\u{b:04x}");
        } else {
            out.push_str(esc);
        }
        start = i + 1;
    }
    out.push_str(&s[start..]);
    out.push('"');
}

/// A float as Python's `repr` spells it (what `json.dumps` writes): the shortest digits that
/// read back as the same float, positional from 1e-4 up to below 1e16, else with an exponent
/// of at least two digits (`1e+16`, `1.5e-07`); a whole number keeps `.0`.
pub(crate) fn float(out: &mut String, f: f64) -> Result<(), Refusal> {
    if !f.is_finite() {
        return Err(Refusal::new(format!(
            "float {} is not valid JSON (NaN and Infinity are not numbers in JSON)",
            if f.is_nan() {
                "nan"
            } else if f > 0.0 {
                "inf"
            } else {
                "-inf"
            }
        )));
    }
    // Rust's `{:e}` is the shortest round-trip form too: `-1.2345e-7`, `0e0`.
    let mut sci = String::with_capacity(32);
    let _ = write!(sci, "{f:e}");
    let (mantissa, exp) = sci.split_once('e').expect("{:e} writes an exponent");
    let exp: i32 = exp.parse().expect("{:e} writes an integer exponent");
    let (negative, mantissa) = match mantissa.strip_prefix('-') {
        Some(m) => (true, m),
        None => (false, mantissa),
    };
    let mut digits = [0u8; 24];
    let mut n = 0;
    for b in mantissa.bytes().filter(|b| b.is_ascii_digit()) {
        digits[n] = b;
        n += 1;
    }
    let digits = std::str::from_utf8(&digits[..n]).expect("ASCII digits");
    // Python's rule (`float_repr_style` "short"): the decimal point sits `decpt` digits in.
    let decpt = exp + 1;
    if negative {
        out.push('-');
    }
    if !(-4 < decpt && decpt <= 16) {
        out.push_str(&digits[..1]);
        if n > 1 {
            out.push('.');
            out.push_str(&digits[1..]);
        }
        let _ = write!(
            out,
            "e{}{:02}",
            if exp < 0 { '-' } else { '+' },
            exp.unsigned_abs()
        );
    } else if decpt <= 0 {
        out.push_str("0.");
        (0..-decpt).for_each(|_| out.push('0'));
        out.push_str(digits);
    } else if decpt as usize >= n {
        out.push_str(digits);
        (0..decpt as usize - n).for_each(|_| out.push('0'));
        out.push_str(".0");
    } else {
        out.push_str(&digits[..decpt as usize]);
        out.push('.');
        out.push_str(&digits[decpt as usize..]);
    }
    Ok(())
}
