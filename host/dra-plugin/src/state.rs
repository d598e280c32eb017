//! Prepare and unprepare: from an allocated ResourceClaim to its CDI spec, checkpointed.
//!
//! Both are idempotent: a claim already prepared (also before a restart: the checkpoint is read
//! at start) is answered from the checkpoint without touching the GPUs again, and unpreparing
//! an unknown claim succeeds. The CDI spec is written before the checkpoint, so a crash in
//! between leaves a spec that the repeated prepare rewrites; the checkpoint entry goes last on
//! unprepare.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    sync::Arc,
};

use k8s_openapi::api::resource::v1::ResourceClaim;
use kiln_device_plugin::settings::Settings;

use crate::{
    DRIVER_NAME, cdi,
    checkpoint::{self, CheckpointError, Claims, PreparedClaim, PreparedDevice},
    config::{self, Sharing, SharingApplier, TimeSlice},
    slices::Allocatable,
};

/// Where the state lives and how CDI specs are generated.
#[derive(Clone)]
pub struct StateOptions {
    /// This node (the pool name).
    pub node: String,
    /// The checkpoint file.
    pub checkpoint: PathBuf,
    /// CDI spec directory.
    pub cdi_root: PathBuf,
    /// The CDI generator's settings (driver root, dev root, hook path).
    pub settings: Settings,
    /// This container's view of the driver root (where libraries are looked up).
    pub container_driver_root: PathBuf,
    /// Applies time-slicing.
    pub applier: Arc<dyn SharingApplier>,
}

impl std::fmt::Debug for StateOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StateOptions")
            .field("node", &self.node)
            .field("checkpoint", &self.checkpoint)
            .field("cdi_root", &self.cdi_root)
            .finish_non_exhaustive()
    }
}

/// The node's devices and prepared claims.
#[derive(Debug)]
pub struct DeviceState {
    opts: StateOptions,
    devices: BTreeMap<String, Allocatable>,
    driver_version: String,
    claims: Claims,
}

impl DeviceState {
    /// The state over `devices` (every allocatable device, healthy or not) with the claims of
    /// the checkpoint.
    ///
    /// # Errors
    /// The checkpoint cannot be read or is corrupt.
    pub fn new(
        opts: StateOptions,
        devices: Vec<Allocatable>,
        driver_version: String,
    ) -> Result<Self, CheckpointError> {
        let claims = checkpoint::load(&opts.checkpoint)?;
        Ok(Self {
            opts,
            devices: devices.into_iter().map(|d| (d.name.clone(), d)).collect(),
            driver_version,
            claims,
        })
    }

    /// Replaces the devices and the driver version (a driver upgrade or a MIG change); prepared
    /// claims stay as they are.
    pub fn set_devices(&mut self, devices: Vec<Allocatable>, driver_version: String) {
        self.devices = devices.into_iter().map(|d| (d.name.clone(), d)).collect();
        self.driver_version = driver_version;
    }

    /// The prepared claims by UID.
    #[must_use]
    pub fn prepared(&self) -> &Claims {
        &self.claims
    }

    /// The checkpoint file.
    #[must_use]
    pub fn checkpoint_path(&self) -> &Path {
        &self.opts.checkpoint
    }

    /// Prepares `claim` (allocated; its devices of this driver on this node's pool): applies
    /// its sharing config, writes its CDI spec, checkpoints it and returns its devices. A claim
    /// prepared before is answered from the checkpoint (its spec rewritten if it went missing).
    ///
    /// # Errors
    /// A reason for the kubelet (and the pod's events): the claim has no UID or no allocation
    /// here, names a device this node does not have, carries a config that is refused, or a
    /// file could not be written.
    pub fn prepare(&mut self, claim: &ResourceClaim) -> Result<Vec<PreparedDevice>, String> {
        let uid = claim
            .metadata
            .uid
            .clone()
            .ok_or("the claim has no metadata.uid")?;
        if let Some(done) = self.claims.get(&uid) {
            let devices = done.devices.clone();
            if !cdi::spec_file(&self.opts.cdi_root, &uid).exists() {
                let allocs: Vec<Allocatable> = devices
                    .iter()
                    .filter_map(|d| self.devices.get(&d.device).cloned())
                    .collect();
                self.write_spec(&uid, &allocs.iter().collect::<Vec<_>>())?;
            }
            return Ok(devices);
        }
        let allocation = claim
            .status
            .as_ref()
            .and_then(|s| s.allocation.as_ref())
            .and_then(|a| a.devices.as_ref())
            .ok_or_else(|| format!("claim {} is not allocated", claim_ref(claim)))?;
        let configs = allocation.config.as_deref().unwrap_or_default();
        let mut devices = Vec::new();
        let mut allocs = Vec::new();
        for r in allocation.results.iter().flatten() {
            if r.driver != DRIVER_NAME || r.pool != self.opts.node {
                continue;
            }
            let a = self.devices.get(&r.device).ok_or_else(|| {
                format!(
                    "claim {}: device {} is not a device of node {}",
                    claim_ref(claim),
                    r.device,
                    self.opts.node
                )
            })?;
            let sharing = match config::applicable(configs, &r.request) {
                Some(params) => Some(
                    config::parse(params, a.kind)
                        .map_err(|e| format!("claim {}: {e}", claim_ref(claim)))?,
                ),
                None => None,
            };
            if let Some(d) = devices
                .iter_mut()
                .find(|d: &&mut PreparedDevice| d.device == r.device)
            {
                d.requests.push(r.request.clone());
                continue;
            }
            devices.push(PreparedDevice {
                requests: vec![r.request.clone()],
                pool: r.pool.clone(),
                device: r.device.clone(),
                uuid: a.uuid.clone(),
                cdi_ids: vec![cdi::qualified(&uid, &r.device)],
                sharing,
            });
            allocs.push(a.clone());
        }
        if devices.is_empty() {
            return Err(format!(
                "claim {} has no {DRIVER_NAME} device allocated on node {}",
                claim_ref(claim),
                self.opts.node
            ));
        }
        for d in &devices {
            if let Some(Sharing::TimeSlicing(slice)) = d.sharing
                && slice != TimeSlice::Default
            {
                self.opts
                    .applier
                    .set_time_slice(&d.uuid, slice)
                    .map_err(|e| format!("claim {}: time-slicing: {e}", claim_ref(claim)))?;
            }
        }
        self.write_spec(&uid, &allocs.iter().collect::<Vec<_>>())?;
        self.claims.insert(
            uid.clone(),
            PreparedClaim {
                namespace: claim.metadata.namespace.clone().unwrap_or_default(),
                name: claim.metadata.name.clone().unwrap_or_default(),
                devices: devices.clone(),
            },
        );
        if let Err(e) = checkpoint::save(&self.opts.checkpoint, &self.claims) {
            self.claims.remove(&uid);
            return Err(kiln_gpu::error_chain(&e));
        }
        Ok(devices)
    }

    fn write_spec(&self, uid: &str, allocs: &[&Allocatable]) -> Result<(), String> {
        let spec = cdi::claim_spec(
            uid,
            allocs,
            &self.opts.settings,
            &self.driver_version,
            &self.opts.container_driver_root,
        );
        cdi::write(&self.opts.cdi_root, uid, &spec)
            .map(|_| ())
            .map_err(|e| kiln_gpu::error_chain(&e))
    }

    /// Unprepares claim `uid`: sets a changed time-slice back to `Default`, removes its CDI
    /// spec and its checkpoint entry. An unknown claim is already unprepared.
    ///
    /// # Errors
    /// A file could not be removed or written (the claim stays prepared, so the kubelet's retry
    /// does the work again).
    pub fn unprepare(&mut self, uid: &str) -> Result<(), String> {
        let Some(claim) = self.claims.get(uid) else {
            return Ok(());
        };
        for d in &claim.devices {
            if let Some(Sharing::TimeSlicing(slice)) = d.sharing
                && slice != TimeSlice::Default
            {
                self.opts
                    .applier
                    .set_time_slice(&d.uuid, TimeSlice::Default)
                    .map_err(|e| format!("resetting time-slicing of {}: {e}", d.uuid))?;
            }
        }
        cdi::remove(&self.opts.cdi_root, uid).map_err(|e| e.to_string())?;
        let removed = self.claims.remove(uid);
        if let Err(e) = checkpoint::save(&self.opts.checkpoint, &self.claims) {
            if let Some(c) = removed {
                self.claims.insert(uid.to_owned(), c);
            }
            return Err(kiln_gpu::error_chain(&e));
        }
        Ok(())
    }
}

fn claim_ref(claim: &ResourceClaim) -> String {
    format!(
        "{}/{}",
        claim.metadata.namespace.as_deref().unwrap_or_default(),
        claim.metadata.name.as_deref().unwrap_or_default()
    )
}

#[cfg(test)]
mod tests;
