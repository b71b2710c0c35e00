//! The operator: reconciles `GPUPool` and `GPUQuota` into the pool's scheduler and writes
//! their status; refuses claims over quota.
//!
//! The scheduler is behind [`PoolBackend`] (set a pool's policy, set a tenant's quota, admit
//! and release claims, read usage); [`ControllerPool`] is it over a controller's pool, the
//! same scheduler core and ledger the standalone controller places sessions in, so a claim
//! and a `gpufuse run --tenant NAMESPACE` session count against one quota. A tenant is a
//! namespace. A `GPUPool` with a `placement` makes its nodes a node group of that scheduler
//! with that policy: the sessions the controller places on them are placed by it.
//!
//! One pass ([`Operator::reconcile`]) reads everything it needs (pools, quotas, nodes, the
//! driver's ResourceSlices, ResourceClaims) and converges: pools' policies and quotas into the
//! backend (a pool or quota deleted is removed there), each
//! allocated claim of the driver admitted or refused (a claim over quota gets the
//! [`QUOTA_REFUSED_ANNOTATION`] and a Warning Event `OverQuota`; the DRA plugin will not
//! prepare it), claims gone released, and statuses written where they changed. [`run`] makes a
//! pass at start, after every change a watch reports, and at an interval.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Mutex;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, ObjectReference};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use serde_json::json;

use crate::crd::{
    Amounts, GPUPool, GPUPoolStatus, GPUQuota, GPUQuotaStatus, Limits, Oversubscription, Placement,
};
use crate::inventory::Gpu;
use crate::quantity;
use crate::{DRIVER_NAME, QUOTA_REFUSED_ANNOTATION};

/// A pool's policy as the scheduler takes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolPolicy {
    /// The Kubernetes nodes its selector matches (a gpufuse node registers under its
    /// Kubernetes node's name: `gpufuse node --name "$NODE_NAME"`).
    pub nodes: BTreeSet<String>,
    /// `None`: the controller's own policy.
    pub placement: Option<Placement>,
    pub oversubscription: Oversubscription,
}

/// A tenant's quota; `None` limits nothing.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TenantQuota {
    pub total_memory: Option<u64>,
    pub total_compute: Option<u64>,
    pub total_claims: Option<u64>,
    pub claim_memory: Option<u64>,
    pub claim_compute: Option<u64>,
}

/// What one allocated claim holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClaimUsage {
    pub uid: String,
    pub tenant: String,
    pub name: String,
    pub node: String,
    pub memory: u64,
    pub compute: u64,
}

/// Usage of a tenant or a pool.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    pub memory: u64,
    pub compute: u64,
    pub claims: u64,
}

/// The pool's scheduler, as the operator drives it.
pub trait PoolBackend: Send + Sync {
    /// Places sessions on the pool's nodes by its placement policy.
    fn set_policy(&self, pool: &str, policy: PoolPolicy);
    fn remove_policy(&self, pool: &str);
    /// The pools whose policy is set.
    fn pools(&self) -> Vec<String>;
    /// Sets a tenant's quota from its GPUQuota (`None`: the GPUQuota is gone).
    fn set_tenant_quota(&self, tenant: &str, quota: Option<TenantQuota>);
    /// The tenants whose quota a GPUQuota set.
    fn quota_tenants(&self) -> Vec<String>;
    /// Admits a claim (again: admitting an admitted claim changes nothing) or says why not.
    fn admit_claim(&self, claim: &ClaimUsage) -> Result<(), String>;
    fn release_claim(&self, uid: &str);
    /// Uids of the admitted claims.
    fn admitted(&self) -> Vec<String>;
    fn tenant_usage(&self, tenant: &str) -> Usage;
    fn pool_usage(&self, pool: &str) -> Usage;
}

/// The [`PoolBackend`] over a controller's pool (`gpufuse-controller`): a namespace's quota
/// is that tenant's quota in the controller's ledger, and claims are charged there
/// ([`gpufuse_controller::Controller::charge_claim`]) beside the sessions the controller
/// places, with the scheduler's quota checks and messages. `gpufuse controller --kubernetes`
/// drives its own controller through it; `gpufuse operator` one that listens nowhere.
pub struct ControllerPool {
    controller: gpufuse_controller::Controller,
    policies: Mutex<HashMap<String, PoolPolicy>>,
    /// The tenants whose quota a GPUQuota set.
    quota_tenants: Mutex<BTreeSet<String>>,
}

impl ControllerPool {
    pub fn new(controller: gpufuse_controller::Controller) -> Self {
        Self {
            controller,
            policies: Mutex::default(),
            quota_tenants: Mutex::default(),
        }
    }

    pub fn controller(&self) -> &gpufuse_controller::Controller {
        &self.controller
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn clamp_u32(v: u64) -> u32 {
    u32::try_from(v).unwrap_or(u32::MAX)
}

/// A GPUQuota's limits as the scheduler's quota file says them.
pub fn scheduler_quota(q: &TenantQuota) -> gpufuse_scheduler::TenantQuota {
    gpufuse_scheduler::TenantQuota {
        vram: q.total_memory,
        compute: q.total_compute.map(clamp_u32),
        sessions: q.total_claims.map(clamp_u32),
        max_session_vram: q.claim_memory,
        max_session_compute: q.claim_compute.map(clamp_u32),
    }
}

impl PoolBackend for ControllerPool {
    /// The pool's nodes become a node group of the controller's scheduler with the pool's
    /// policy (no group without one: the controller's policy places there already).
    fn set_policy(&self, pool: &str, policy: PoolPolicy) {
        match policy.placement {
            Some(p) => self
                .controller
                .set_node_group(pool, policy.nodes.clone(), p.policy()),
            None => {
                self.controller.remove_node_group(pool);
            }
        }
        lock(&self.policies).insert(pool.into(), policy);
    }

    fn remove_policy(&self, pool: &str) {
        self.controller.remove_node_group(pool);
        lock(&self.policies).remove(pool);
    }

    fn pools(&self) -> Vec<String> {
        lock(&self.policies).keys().cloned().collect()
    }

    fn set_tenant_quota(&self, tenant: &str, quota: Option<TenantQuota>) {
        let mut set = lock(&self.quota_tenants);
        match &quota {
            Some(_) => set.insert(tenant.to_string()),
            None => set.remove(tenant),
        };
        self.controller
            .set_tenant_quota(tenant, quota.as_ref().map(scheduler_quota));
    }

    fn quota_tenants(&self) -> Vec<String> {
        lock(&self.quota_tenants).iter().cloned().collect()
    }

    fn admit_claim(&self, c: &ClaimUsage) -> Result<(), String> {
        self.controller.charge_claim(
            &c.uid,
            gpufuse_scheduler::ClaimCharge {
                tenant: c.tenant.clone(),
                node: c.node.clone(),
                vram_bytes: c.memory,
                compute_percent: clamp_u32(c.compute),
            },
        )
    }

    fn release_claim(&self, uid: &str) {
        self.controller.release_claim(uid);
    }

    fn admitted(&self) -> Vec<String> {
        self.controller
            .claims()
            .into_iter()
            .map(|(k, _)| k)
            .collect()
    }

    fn tenant_usage(&self, tenant: &str) -> Usage {
        let u = self.controller.tenant_usage(tenant);
        Usage {
            memory: u.vram,
            compute: u64::from(u.compute),
            claims: u64::from(u.sessions),
        }
    }

    fn pool_usage(&self, pool: &str) -> Usage {
        let Some(nodes) = lock(&self.policies).get(pool).map(|p| p.nodes.clone()) else {
            return Usage::default();
        };
        self.controller
            .claims()
            .iter()
            .filter(|(_, c)| nodes.contains(&c.node))
            .fold(Usage::default(), |u, (_, c)| Usage {
                memory: u.memory + c.vram_bytes,
                compute: u.compute + u64::from(c.compute_percent),
                claims: u.claims + 1,
            })
    }
}

/// The operator's errors (a pass that fails is retried at the next change or interval).
#[derive(Debug, thiserror::Error)]
pub enum OperatorError {
    #[error("cannot {what}")]
    Api {
        what: String,
        #[source]
        source: Box<kube::Error>,
    },
}

fn api_err(what: impl Into<String>) -> impl FnOnce(kube::Error) -> OperatorError {
    let what = what.into();
    move |source| OperatorError::Api {
        what,
        source: Box::new(source),
    }
}

/// The operator.
pub struct Operator<B: PoolBackend> {
    pub client: kube::Client,
    pub backend: B,
    /// The name it reports Events as (`reportingInstance`).
    pub instance: String,
}

/// The GPUs of the driver's ResourceSlices, by node.
fn gpus_by_node(slices: &[ResourceSlice]) -> BTreeMap<String, Vec<Gpu>> {
    let mut out: BTreeMap<String, Vec<Gpu>> = BTreeMap::new();
    for s in slices.iter().filter(|s| s.spec.driver == DRIVER_NAME) {
        let Some(node) = &s.spec.node_name else {
            continue;
        };
        for d in s.spec.devices.iter().flatten() {
            let memory = d
                .capacity
                .as_ref()
                .and_then(|c| c.get(crate::slice::MEMORY))
                .and_then(|c| quantity::parse_quantity(&c.value).ok())
                .unwrap_or(0);
            out.entry(node.clone()).or_default().push(Gpu {
                index: 0,
                name: d.name.clone(),
                model: String::new(),
                uuid: String::new(),
                compute_capability: (0, 0),
                memory_bytes: memory,
                emulated: false,
            });
        }
    }
    out
}

fn labels_match(node: &Node, selector: &BTreeMap<String, String>) -> bool {
    let labels = node.metadata.labels.clone().unwrap_or_default();
    selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

fn quota_of(q: &GPUQuota) -> Result<TenantQuota, quantity::QuantityError> {
    let mem = |l: &Limits| l.memory.as_ref().map(quantity::parse_quantity).transpose();
    Ok(TenantQuota {
        total_memory: mem(&q.spec.total)?,
        total_compute: q.spec.total.compute,
        total_claims: q.spec.total.claims,
        claim_memory: mem(&q.spec.per_claim)?,
        claim_compute: q.spec.per_claim.compute,
    })
}

fn amounts(u: Usage) -> Amounts {
    Amounts {
        memory: quantity::bytes(u.memory),
        compute: u.compute,
        claims: u.claims,
    }
}

impl<B: PoolBackend> Operator<B> {
    /// One pass over everything.
    pub async fn reconcile(&self) -> Result<(), OperatorError> {
        let lp = ListParams::default();
        let pools: Api<GPUPool> = Api::all(self.client.clone());
        let quotas: Api<GPUQuota> = Api::all(self.client.clone());
        let nodes: Api<Node> = Api::all(self.client.clone());
        let slices: Api<ResourceSlice> = Api::all(self.client.clone());
        let claims: Api<ResourceClaim> = Api::all(self.client.clone());
        let pools = pools
            .list(&lp)
            .await
            .map_err(api_err("list GPUPools"))?
            .items;
        let quotas = quotas
            .list(&lp)
            .await
            .map_err(api_err("list GPUQuotas"))?
            .items;
        let nodes = nodes.list(&lp).await.map_err(api_err("list Nodes"))?.items;
        let slices = slices
            .list(&lp)
            .await
            .map_err(api_err("list ResourceSlices"))?
            .items;
        let claims = claims
            .list(&lp)
            .await
            .map_err(api_err("list ResourceClaims"))?
            .items;
        let gpus = gpus_by_node(&slices);

        // Quotas, one per namespace (the first by name when there are several).
        let mut by_tenant: BTreeMap<String, &GPUQuota> = BTreeMap::new();
        for q in &quotas {
            let ns = q.metadata.namespace.clone().unwrap_or_default();
            by_tenant.entry(ns).or_insert(q);
        }
        let mut tenants_seen: BTreeSet<String> = BTreeSet::new();
        for (ns, q) in &by_tenant {
            match quota_of(q) {
                Ok(tq) => self.backend.set_tenant_quota(ns, Some(tq)),
                Err(e) => tracing::warn!(
                    "GPUQuota {ns}/{}: {e}",
                    q.metadata.name.clone().unwrap_or_default()
                ),
            }
            tenants_seen.insert(ns.clone());
        }
        for gone in self.backend.quota_tenants() {
            if !tenants_seen.contains(&gone) {
                self.backend.set_tenant_quota(&gone, None);
            }
        }

        // Pools first, so pool usage sees their nodes.
        let pool_names: BTreeSet<String> = pools
            .iter()
            .filter_map(|p| p.metadata.name.clone())
            .collect();
        for gone in self.backend.pools() {
            if !pool_names.contains(&gone) {
                self.backend.remove_policy(&gone);
            }
        }
        for p in &pools {
            let name = p.metadata.name.clone().unwrap_or_default();
            let members: BTreeSet<String> = nodes
                .iter()
                .filter(|n| labels_match(n, &p.spec.node_selector))
                .filter_map(|n| n.metadata.name.clone())
                .collect();
            self.backend.set_policy(
                &name,
                PoolPolicy {
                    nodes: members,
                    placement: p.spec.placement,
                    oversubscription: p.spec.oversubscription.clone(),
                },
            );
        }

        // Claims.
        let mut live: BTreeSet<String> = BTreeSet::new();
        let mut refused: BTreeMap<String, u64> = BTreeMap::new();
        for c in &claims {
            let Some(usage) = claim_usage(c, &gpus) else {
                continue;
            };
            let annotations = c.metadata.annotations.clone().unwrap_or_default();
            if annotations.contains_key(QUOTA_REFUSED_ANNOTATION) {
                *refused.entry(usage.tenant.clone()).or_default() += 1;
                continue;
            }
            live.insert(usage.uid.clone());
            if let Err(reason) = self.backend.admit_claim(&usage) {
                live.remove(&usage.uid);
                *refused.entry(usage.tenant.clone()).or_default() += 1;
                self.refuse(c, &usage, &reason).await?;
            }
        }
        for uid in self.backend.admitted() {
            if !live.contains(&uid) {
                self.backend.release_claim(&uid);
            }
        }

        // Statuses.
        for p in &pools {
            let name = p.metadata.name.clone().unwrap_or_default();
            let members: Vec<&String> = nodes
                .iter()
                .filter(|n| labels_match(n, &p.spec.node_selector))
                .filter_map(|n| n.metadata.name.as_ref())
                .collect();
            let devices: Vec<&Gpu> = members
                .iter()
                .filter_map(|n| gpus.get(*n))
                .flatten()
                .collect();
            let o = &p.spec.oversubscription;
            let total: u64 = devices.iter().map(|g| g.memory_bytes).sum();
            let memory = (u128::from(total) * u128::from(o.memory_percent) / 100) as u64;
            let compute = devices.len() as u64 * u64::from(o.compute_percent);
            let used = self.backend.pool_usage(&name);
            let status = GPUPoolStatus {
                nodes: members.len() as u32,
                devices: devices.len() as u32,
                capacity: Amounts {
                    memory: quantity::bytes(memory),
                    compute,
                    claims: 0,
                },
                used: amounts(used),
                available: Amounts {
                    memory: quantity::bytes(memory.saturating_sub(used.memory)),
                    compute: compute.saturating_sub(used.compute),
                    claims: 0,
                },
                observed_generation: p.metadata.generation,
            };
            if p.status.as_ref() != Some(&status) {
                let api: Api<GPUPool> = Api::all(self.client.clone());
                api.patch_status(
                    &name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({ "status": status })),
                )
                .await
                .map_err(api_err(format!("write the status of GPUPool {name}")))?;
            }
        }
        for (ns, q) in &by_tenant {
            let name = q.metadata.name.clone().unwrap_or_default();
            let Ok(tq) = quota_of(q) else { continue };
            let used = self.backend.tenant_usage(ns);
            let status = GPUQuotaStatus {
                used: amounts(used),
                available: Limits {
                    memory: tq
                        .total_memory
                        .map(|m| quantity::bytes(m.saturating_sub(used.memory))),
                    compute: tq.total_compute.map(|c| c.saturating_sub(used.compute)),
                    claims: tq.total_claims.map(|c| c.saturating_sub(used.claims)),
                },
                refused: refused.get(ns).copied().unwrap_or(0),
            };
            if q.status.as_ref() != Some(&status) {
                let api: Api<GPUQuota> = Api::namespaced(self.client.clone(), ns);
                api.patch_status(
                    &name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({ "status": status })),
                )
                .await
                .map_err(api_err(format!("write the status of GPUQuota {ns}/{name}")))?;
            }
        }
        Ok(())
    }

    /// Marks a claim refused and tells its owner why, in an Event on the claim.
    async fn refuse(
        &self,
        c: &ResourceClaim,
        u: &ClaimUsage,
        reason: &str,
    ) -> Result<(), OperatorError> {
        tracing::info!("refused ResourceClaim {}/{}: {reason}", u.tenant, u.name);
        let api: Api<ResourceClaim> = Api::namespaced(self.client.clone(), &u.tenant);
        let patch = json!({ "metadata": { "annotations": { QUOTA_REFUSED_ANNOTATION: reason } } });
        api.patch(&u.name, &PatchParams::default(), &Patch::Merge(patch))
            .await
            .map_err(api_err(format!(
                "annotate ResourceClaim {}/{}",
                u.tenant, u.name
            )))?;
        let events: Api<Event> = Api::namespaced(self.client.clone(), &u.tenant);
        let event = Event {
            metadata: ObjectMeta {
                generate_name: Some(format!("{}.", u.name)),
                namespace: Some(u.tenant.clone()),
                ..Default::default()
            },
            type_: Some("Warning".into()),
            reason: Some("OverQuota".into()),
            action: Some("Admit".into()),
            note: Some(format!("GPUQuota refused the claim: {reason}")),
            regarding: Some(ObjectReference {
                api_version: Some("resource.k8s.io/v1".into()),
                kind: Some("ResourceClaim".into()),
                name: Some(u.name.clone()),
                namespace: Some(u.tenant.clone()),
                uid: Some(u.uid.clone()),
                resource_version: c.metadata.resource_version.clone(),
                ..Default::default()
            }),
            reporting_controller: Some("gpufuse.dev/operator".into()),
            reporting_instance: Some(self.instance.clone()),
            event_time: Some(MicroTime(now())),
            ..Default::default()
        };
        events
            .create(&PostParams::default(), &event)
            .await
            .map_err(api_err(format!(
                "record an Event on ResourceClaim {}/{}",
                u.tenant, u.name
            )))?;
        Ok(())
    }
}

fn now() -> k8s_openapi::jiff::Timestamp {
    k8s_openapi::jiff::Timestamp::now()
}

/// What an allocated claim holds of the driver's devices (`None`: not allocated, or nothing
/// of ours).
pub fn claim_usage(c: &ResourceClaim, gpus: &BTreeMap<String, Vec<Gpu>>) -> Option<ClaimUsage> {
    let results = c
        .status
        .as_ref()?
        .allocation
        .as_ref()?
        .devices
        .as_ref()?
        .results
        .clone()?;
    let ours: Vec<_> = results.iter().filter(|r| r.driver == DRIVER_NAME).collect();
    let first = ours.first()?;
    let name = c.metadata.name.clone()?;
    let tenant = c.metadata.namespace.clone()?;
    let (mut memory, mut compute) = (0u64, 0u64);
    for r in &ours {
        let gpu = gpus
            .get(&r.pool)
            .and_then(|g| g.iter().find(|g| g.name == r.device))
            .cloned()
            .unwrap_or(Gpu {
                index: 0,
                name: r.device.clone(),
                model: String::new(),
                uuid: String::new(),
                compute_capability: (0, 0),
                memory_bytes: 0,
                emulated: false,
            });
        let s = crate::prepare::consumed(&name, r, &gpu).ok();
        memory += s.map_or(0, |s| s.vram_bytes);
        compute += s.map_or(0, |s| u64::from(s.compute_percent));
    }
    Some(ClaimUsage {
        uid: c.metadata.uid.clone()?,
        tenant,
        name,
        node: first.pool.clone(),
        memory,
        compute,
    })
}

/// Runs the operator: a pass at start, after changes the watches see (debounced by
/// `settle`), and every `interval`.
pub async fn run<B: PoolBackend>(op: Operator<B>, interval: Duration, settle: Duration) {
    let c = op.client.clone();
    let cfg = watcher::Config::default;
    let changes = futures::stream::select_all([
        watcher(Api::<GPUPool>::all(c.clone()), cfg())
            .map(|_| ())
            .boxed(),
        watcher(Api::<GPUQuota>::all(c.clone()), cfg())
            .map(|_| ())
            .boxed(),
        watcher(Api::<ResourceClaim>::all(c.clone()), cfg())
            .map(|_| ())
            .boxed(),
        watcher(Api::<ResourceSlice>::all(c.clone()), cfg())
            .map(|_| ())
            .boxed(),
        watcher(Api::<Node>::all(c), cfg()).map(|_| ()).boxed(),
    ]);
    tokio::pin!(changes);
    let mut tick = tokio::time::interval(interval);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            next = changes.next() => {
                if next.is_none() {
                    return;
                }
                tokio::time::sleep(settle).await;
                // One pass covers every change that arrived meanwhile.
                while let Some(Some(())) = futures::FutureExt::now_or_never(changes.next()) {}
            }
        }
        if let Err(e) = op.reconcile().await {
            tracing::warn!(
                "reconcile failed (retried at the next change): {}",
                crate::error_chain(&e)
            );
        }
    }
}
