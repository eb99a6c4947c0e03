//! `hooks.decide(point, agent, payload)`: the decision lane asked from Python, answered by the
//! policies in force (`<workspace>/policies.json`) as `Hooks::decide` answers Rust.

use crate::errors::decide_error;
use crate::text::{type_name, utf8};
use crate::tojson;
use prx_hooks::Hooks;
use prx_hooks::policy::{DecideError, DecisionPoint, Verdict};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString};

/// How deep a payload dict may nest: serde_json reads 128 levels, the payload is one.
const PAYLOAD_MAX_DEPTH: usize = 127;

/// What the policies answered: `decision` (`"allow"`, `"ask"`, `"deny"`, or `None` when no
/// policy decides: the agent's own flow), the `reason` and `policy` id of the first policy in
/// file order with that decision, its `context`, and `elapsed` (seconds the decision took).
#[pyclass(frozen, module = "prx_hooks", name = "Verdict")]
pub struct PyVerdict {
    #[pyo3(get)]
    decision: Option<&'static str>,
    #[pyo3(get)]
    reason: Option<String>,
    #[pyo3(get)]
    policy: Option<String>,
    #[pyo3(get)]
    context: Option<String>,
    /// Seconds.
    #[pyo3(get)]
    elapsed: f64,
    elapsed_us: u64,
}

#[pymethods]
impl PyVerdict {
    /// The decision's time in whole microseconds (what `POST /api/decide` answers).
    #[getter]
    fn elapsed_us(&self) -> u64 {
        self.elapsed_us
    }

    /// Whether the policies refuse (`deny`).
    #[getter]
    fn denied(&self) -> bool {
        self.decision == Some("deny")
    }

    /// `{"decision", "reason", "policy", "elapsed_us"}` (and `context` when there is one), as
    /// `POST /api/decide` answers.
    fn to_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        d.set_item("decision", self.decision)?;
        d.set_item("reason", &self.reason)?;
        d.set_item("policy", &self.policy)?;
        d.set_item("elapsed_us", self.elapsed_us)?;
        if let Some(c) = &self.context {
            d.set_item("context", c)?;
        }
        Ok(d)
    }

    fn __repr__(&self) -> String {
        let opt = |o: &Option<String>| match o {
            Some(s) => format!("{s:?}"),
            None => "None".into(),
        };
        format!(
            "Verdict(decision={}, policy={}, reason={}, elapsed_us={})",
            match self.decision {
                Some(d) => format!("{d:?}"),
                None => "None".into(),
            },
            opt(&self.policy),
            opt(&self.reason),
            self.elapsed_us
        )
    }
}

impl From<Verdict> for PyVerdict {
    fn from(v: Verdict) -> PyVerdict {
        PyVerdict {
            decision: v.decision.map(|d| d.as_str()),
            reason: v.reason,
            policy: v.policy,
            context: v.context,
            elapsed: v.elapsed.as_secs_f64(),
            elapsed_us: v.elapsed.as_micros() as u64,
        }
    }
}

/// The decision point named as policies.json names it.
fn point(name: &str) -> PyResult<DecisionPoint> {
    DecisionPoint::from_name(name).ok_or_else(|| {
        let names: Vec<&str> = DecisionPoint::ALL.iter().map(|p| p.as_str()).collect();
        PyValueError::new_err(format!(
            "point={name:?}: not a decision point; expected one of {}",
            names.join(", ")
        ))
    })
}

/// Asks `hooks`' policies (see `Hooks.decide` in `_native.pyi`). A dict payload is written
/// as JSON here (as `arguments=` dicts are); JSON text is read as is. Either way the
/// library's payload limit applies, and its refusals raise `prx_hooks.DecideError`.
pub(crate) fn decide(
    py: Python<'_>,
    hooks: &Hooks,
    point_name: &str,
    agent: &str,
    payload: Option<&Bound<'_, PyAny>>,
    within: Option<f64>,
) -> PyResult<PyVerdict> {
    let point = point(point_name)?;
    let within = match within {
        None => None,
        Some(s) if s.is_finite() && s >= 0.0 => {
            Some(std::time::Duration::from_secs_f64(s.min(3600.0)))
        }
        Some(s) => {
            return Err(pyo3::exceptions::PyValueError::new_err(format!(
                "within={s:?}: expected a number of seconds, 0 or more"
            )));
        }
    };
    let mut buf = String::new();
    let text: &str = match payload {
        None => "{}",
        Some(p) if p.is_none() => "{}",
        Some(p) => {
            if let Ok(s) = p.cast::<PyString>() {
                utf8(s).map_err(|_| crate::text::surrogate_error("payload"))?
            } else if p.cast::<PyDict>().is_ok() {
                tojson::write(&mut buf, p, PAYLOAD_MAX_DEPTH).map_err(|r| r.into_err("payload"))?;
                &buf
            } else {
                return Err(PyTypeError::new_err(format!(
                    "payload: expected a dict or JSON text (str), got {}",
                    type_name(p)
                )));
            }
        }
    };
    // Rules answer in microseconds; other Python threads run meanwhile all the same.
    let verdict = py.detach(|| match within {
        Some(within) => hooks.decide_within(point, agent, text, within),
        None => hooks.decide(point, agent, text),
    });
    verdict
        .map(PyVerdict::from)
        .map_err(|e: DecideError| decide_error(format!("payload: {e}")))
}
