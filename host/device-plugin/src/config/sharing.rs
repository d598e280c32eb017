//! The active sharing setup, as the plugin and GFD use it: strategy, per-resource replicas and
//! the advertised (possibly renamed) resource name.

use super::{Config, qualify_resource_name};

/// How physical devices are shared.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum SharingStrategy {
    /// One advertised unit per device.
    #[default]
    None,
    /// `sharing.timeSlicing`.
    TimeSlicing,
    /// `sharing.mps`.
    Mps,
}

impl SharingStrategy {
    /// The GFD label value: `none`, `time-slicing` or `mps`.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::TimeSlicing => "time-slicing",
            Self::Mps => "mps",
        }
    }
}

impl std::fmt::Display for SharingStrategy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One shared resource of a validated config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SharedResource {
    /// The resource whose devices are shared, qualified (`nvidia.com/gpu`).
    pub name: String,
    /// Replicas per physical device (≥ 2).
    pub replicas: u32,
    /// The name the replicas are advertised under: `name`, or `<name>.shared` with
    /// `renameByDefault: true`.
    pub advertised: String,
}

impl SharedResource {
    /// True when the replicas are advertised under another name than the resource's.
    #[must_use]
    pub fn is_renamed(&self) -> bool {
        self.advertised != self.name
    }
}

/// The active sharing of a [`Config`] (from [`Config::sharing`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Sharing {
    /// Which strategy is active; `None` when no resource is shared.
    pub strategy: SharingStrategy,
    /// Refuse Allocate requests for more than one replica (always true for MPS).
    pub fail_requests_greater_than_one: bool,
    /// The shared resources, in file order.
    pub resources: Vec<SharedResource>,
}

impl Sharing {
    pub(super) fn from_config(cfg: &Config) -> Self {
        let (strategy, spec) = match (&cfg.sharing.mps, &cfg.sharing.time_slicing) {
            (Some(m), _) => (SharingStrategy::Mps, m),
            (None, Some(t)) => (SharingStrategy::TimeSlicing, t),
            (None, None) => return Self::default(),
        };
        let resources: Vec<SharedResource> = spec
            .resources
            .iter()
            .flatten()
            .filter_map(|r| {
                let name = qualify_resource_name(r.name.as_deref()?);
                let replicas = u32::try_from(r.replicas?).ok()?;
                let advertised = r.rename.clone().unwrap_or_else(|| name.clone());
                Some(SharedResource {
                    name,
                    replicas,
                    advertised,
                })
            })
            .collect();
        if resources.is_empty() {
            return Self::default();
        }
        Self {
            strategy,
            fail_requests_greater_than_one: spec.fail_requests_greater_than_one,
            resources,
        }
    }

    /// The shared entry for `resource` (`gpu` or `nvidia.com/gpu`), if it is shared.
    #[must_use]
    pub fn get(&self, resource: &str) -> Option<&SharedResource> {
        let q = qualify_resource_name(resource);
        self.resources.iter().find(|r| r.name == q)
    }

    /// Replicas per physical device of `resource`: 1 when it is not shared.
    #[must_use]
    pub fn replicas(&self, resource: &str) -> u32 {
        self.get(resource).map_or(1, |r| r.replicas)
    }

    /// The name `resource`'s devices are advertised under (renamed or not), qualified.
    #[must_use]
    pub fn advertised_name(&self, resource: &str) -> String {
        self.get(resource)
            .map_or_else(|| qualify_resource_name(resource), |r| r.advertised.clone())
    }

    /// The strategy as it applies to `resource`: [`SharingStrategy::None`] when that resource
    /// is not shared.
    #[must_use]
    pub fn strategy_for(&self, resource: &str) -> SharingStrategy {
        if self.get(resource).is_some() {
            self.strategy
        } else {
            SharingStrategy::None
        }
    }
}
