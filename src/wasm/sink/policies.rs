//! The WASM policies of a load: each plugin with `[policy]` built (compiled through the cache,
//! `decide` found, linked, probed) when its files changed, kept when they did not, kept too when
//! its new version fails or its plugin.toml became invalid (the last good one stays), and put
//! in force at once ([`PluginPolicies`]) for the decision lane.

use super::*;
use crate::policy::{PluginPolicies, PluginPolicy, PluginPolicyCounters};
use crate::wasm::policy::{WasmPolicy, find_policy_export};

/// Each plugin's running policy and what it was built from.
pub(super) type PolicyVersions = BTreeMap<String, (Fingerprint, Arc<WasmPolicy>)>;

impl WasmSink {
    /// The WASM policies in force (what the decision lane asks).
    pub(crate) fn policies(&self) -> Arc<PluginPolicies> {
        self.policies.clone()
    }

    /// Builds what changed among the policies of `read` (outside the state lock), keeping the
    /// running version of every plugin whose manifest failed (`failed`) or whose new version
    /// fails; gives the set to put in force.
    pub(super) fn build_policies(
        &self,
        engine: Option<&EnginePair>,
        read: Vec<Read>,
        failed: &[String],
        report: &mut LoadReport,
    ) -> PolicyVersions {
        let current = self.state().policies.clone();
        let mut next: PolicyVersions = current
            .iter()
            .filter(|(name, _)| failed.contains(name))
            .map(|(n, v)| (n.clone(), v.clone()))
            .collect();
        for (m, fp, bytes) in read {
            match current.get(&m.name) {
                Some((old, p)) if *old == fp => {
                    next.insert(m.name.clone(), (fp, p.clone()));
                    continue;
                }
                _ => {}
            }
            let built = match engine {
                Some((engine, linker)) => self.build_policy(engine, linker, &m, &bytes),
                None => Err(PluginError::in_file(
                    &m.file,
                    "no wasm engine (see the errors above)",
                )),
            };
            match built {
                Ok(p) => {
                    if !report.started.contains(&m.name) {
                        report.started.push(m.name.clone());
                    }
                    next.insert(m.name.clone(), (fp, p));
                }
                Err(e) => {
                    report.push_error(e);
                    if let Some(old) = current.get(&m.name) {
                        tracing::warn!(plugin = %m.name, "the new version of the policy failed to load; the previous one stays in force");
                        next.insert(m.name.clone(), old.clone());
                    }
                }
            }
        }
        next
    }

    /// Puts `next` in force (under the state lock): the decision lane sees it at once.
    pub(super) fn swap_policies(&self, st: &mut LoadState, next: PolicyVersions) {
        let set: Vec<Arc<dyn PluginPolicy>> = next
            .values()
            .map(|(_, p)| p.clone() as Arc<dyn PluginPolicy>)
            .collect();
        self.policies.store(set);
        st.policies = next;
    }

    /// Compiles, links and probes one policy.
    fn build_policy(
        &self,
        engine: &Arc<WasmEngine>,
        linker: &Linker<HostState>,
        m: &Manifest,
        bytes: &[u8],
    ) -> Result<Arc<WasmPolicy>, PluginError> {
        let spec = m.policy.as_ref().expect("a policy manifest");
        let (ctx, counters) = {
            let mut st = self.state();
            let log = st
                .logs
                .entry(m.name.clone())
                .or_insert_with(|| Arc::new(self.logger.plugin(m.name.as_str().into())))
                .clone();
            let counters: Arc<PluginPolicyCounters> =
                st.policy_counts.entry(spec.id.clone()).or_default().clone();
            let ctx = policy_ctx(m, &self.flusher, &self.bus, self.abort.clone(), log);
            (ctx, counters)
        };
        let (policy, compiled) =
            prepare_policy(engine, linker, m, bytes, self.cache.as_ref(), ctx, counters)?;
        let mut st = self.state();
        if compiled == Compiled::Cached {
            st.cache_hits += 1;
        } else {
            st.compiled += 1;
        }
        Ok(Arc::new(policy))
    }
}

/// Compiles (through `cache` when given), finds `decide`, links and probes one policy.
pub(super) fn prepare_policy(
    engine: &Arc<WasmEngine>,
    linker: &Linker<HostState>,
    m: &Manifest,
    bytes: &[u8],
    cache: Option<&CompileCache>,
    ctx: Arc<PluginCtx>,
    counters: Arc<PluginPolicyCounters>,
) -> Result<(WasmPolicy, Compiled), PluginError> {
    let label = m.wasm.display().to_string();
    let fail = |reason: String| PluginError::in_file(&label, reason);
    let (component, compiled) = engine
        .compile(bytes, cache)
        .map_err(|e| fail(format!("not a valid component: {e}")))?;
    let decide = find_policy_export(&component, engine.engine()).map_err(fail)?;
    let pre = linker.instantiate_pre(&component).map_err(|e| {
        fail(format!(
            "cannot link: {} (policies may import prx:host/{{log,config}} and WASI p2 only)",
            one_line(&format!("{e:#}"))
        ))
    })?;
    let policy = WasmPolicy::new(m, ctx, pre, decide, engine.clone(), counters)
        .ok_or_else(|| PluginError::in_file(&m.file, "no [policy]"))?;
    policy.probe().map_err(|e| {
        PluginError::in_file(&m.file, format!("cannot instantiate the policy: {e}"))
    })?;
    Ok((policy, compiled))
}

/// A policy's context: its config and log; no kv (an empty store of no capacity) and no
/// events (not permitted).
pub(super) fn policy_ctx(
    m: &Manifest,
    flusher: &Arc<KvFlusher>,
    bus: &Bus,
    abort: Arc<AtomicBool>,
    log: Arc<PluginLog>,
) -> Arc<PluginCtx> {
    Arc::new(PluginCtx {
        name: m.name.as_str().into(),
        config: m.config.clone(),
        kv: Arc::new(KvStore::in_memory(0)),
        flusher: flusher.clone(),
        events_allowed: false,
        bus: bus.clone(),
        abort,
        stop: AtomicBool::new(false),
        log,
    })
}
