//! Slices the cluster placed, in the controller's ledger: what the Kubernetes operator
//! (`gpufuse controller --kubernetes`) drives. A namespace's `GPUQuota` becomes that tenant's
//! quota in the controller's pool, and each allocated `ResourceClaim` is charged to it
//! ([`gpufuse_scheduler::Pool::charge_claim`]), so a claim and a `gpufuse run --tenant`
//! session count against one quota, with the same checks and messages. A `GPUPool` becomes a
//! node group with its placement policy ([`gpufuse_scheduler::Pool::set_group`]), so the
//! sessions the controller places on its nodes are placed by that policy.

use std::collections::BTreeSet;

use gpufuse_scheduler::{ClaimCharge, NodeGroup, Policy, TenantQuota, TenantUsage};

use crate::Controller;

impl Controller {
    /// Sets `tenant`'s quota (`None`: the quota file's limits for it apply again, if any).
    pub fn set_tenant_quota(&self, tenant: &str, quota: Option<TenantQuota>) {
        let mut b = self.books();
        match &quota {
            Some(q) => b.quota_overrides.insert(tenant.to_string(), q.clone()),
            None => b.quota_overrides.remove(tenant),
        };
        let quota = quota.or_else(|| b.file_quotas.tenants.get(tenant).cloned());
        if b.pool.quotas().tenants.get(tenant) == quota.as_ref() {
            return;
        }
        let mut q = b.pool.quotas().clone();
        q.set_tenant(tenant, quota);
        b.pool.set_quotas(q);
        // Waiting sessions are checked against the new limits.
        self.reschedule(&mut b);
    }

    /// Places sessions on `nodes` (the pool's node names) by `policy` rather than the
    /// controller's `--policy`, as node group `name` (replacing a group of that name).
    pub fn set_node_group(&self, name: &str, nodes: BTreeSet<String>, policy: Policy) {
        self.books()
            .pool
            .set_group(name, NodeGroup { nodes, policy });
    }

    /// Node group `name`'s nodes go back to the controller's policy.
    pub fn remove_node_group(&self, name: &str) -> bool {
        self.books().pool.remove_group(name)
    }

    /// The node groups and their policies, by name.
    pub fn node_groups(&self) -> Vec<(String, NodeGroup)> {
        let b = self.books();
        b.pool
            .groups()
            .iter()
            .map(|(k, g)| (k.clone(), g.clone()))
            .collect()
    }

    /// The policy that places sessions on node `node`.
    pub fn policy_of(&self, node: &str) -> Policy {
        self.books().pool.policy_of(node)
    }

    /// Charges a claim to its tenant under `key` (its uid), or says which limit it is over.
    /// Charging a key again changes nothing.
    pub fn charge_claim(&self, key: &str, claim: ClaimCharge) -> Result<(), String> {
        self.books()
            .pool
            .charge_claim(key, claim)
            .map_err(|e| e.to_string())
    }

    /// Gives back what a claim charged.
    pub fn release_claim(&self, key: &str) -> bool {
        let mut b = self.books();
        let released = b.pool.release_claim(key).is_some();
        if released {
            self.reschedule(&mut b);
        }
        released
    }

    /// The claims charged, by key.
    pub fn claims(&self) -> Vec<(String, ClaimCharge)> {
        let b = self.books();
        b.pool
            .claims()
            .iter()
            .map(|(k, c)| (k.clone(), c.clone()))
            .collect()
    }

    /// What `tenant` holds: its sessions and its claims.
    pub fn tenant_usage(&self, tenant: &str) -> TenantUsage {
        self.books().pool.tenant_usage(tenant)
    }
}
