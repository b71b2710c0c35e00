//! Slices the cluster placed, in the controller's ledger: what the Kubernetes operator
//! (`gpufuse controller --kubernetes`) drives. A namespace's `GPUQuota` becomes that tenant's
//! quota in the controller's pool, and each allocated `ResourceClaim` is charged to it
//! ([`gpufuse_scheduler::Pool::charge_claim`]), so a claim and a `gpufuse run --tenant`
//! session count against one quota, with the same checks and messages.

use gpufuse_scheduler::{ClaimCharge, TenantQuota, TenantUsage};

use crate::Controller;

impl Controller {
    /// Sets `tenant`'s quota (`None`: the quota file's limits for it apply again, if any).
    pub fn set_tenant_quota(&self, tenant: &str, quota: Option<TenantQuota>) {
        let quota = quota.or_else(|| self.0.config.quotas.tenants.get(tenant).cloned());
        let mut b = self.books();
        if b.pool.quotas().tenants.get(tenant) == quota.as_ref() {
            return;
        }
        let mut q = b.pool.quotas().clone();
        q.set_tenant(tenant, quota);
        b.pool.set_quotas(q);
        // Waiting sessions are checked against the new limits.
        self.reschedule(&mut b);
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
