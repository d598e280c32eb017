//! The ClusterPolicy's side of handing the driver to NVIDIADriver CRs
//! (`driver.useNvidiaDriverCRD`): the policy's `driver` state is as ready as the CRs are, read
//! from the NVIDIADriver store the view shares (no call into the NVIDIADriver controller).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kiln_core::spec::nvidiadriver::{NVIDIADriver, NvidiaDriverState};
use kiln_core::status::StateResult;
use kube::ResourceExt;

use crate::cluster::view::View;

/// The ClusterPolicy's `driver` state result while it hands the driver to NVIDIADriver CRs:
/// ready when every NVIDIADriver is `ready`; not ready naming each one that is not (or when
/// none exists: no driver would run). A CR whose status was not yet written counts as not
/// ready. The CRs come from the view's NVIDIADriver store (no request); without the CRD
/// served, not ready saying so.
pub async fn policy_driver_result(view: &View) -> StateResult {
    match view.drivers().await {
        Some(list) => driver_result(list.iter().map(|d| &**d)),
        None => StateResult::NotReady(
            "driver.useNvidiaDriverCRD is set but the NVIDIADriver CRD is not installed".into(),
        ),
    }
}

/// [`policy_driver_result`] over the CRs.
pub fn driver_result<'a>(drivers: impl IntoIterator<Item = &'a NVIDIADriver>) -> StateResult {
    let drivers: Vec<&NVIDIADriver> = drivers.into_iter().collect();
    if drivers.is_empty() {
        return StateResult::NotReady(
            "driver.useNvidiaDriverCRD is set but no NVIDIADriver exists".into(),
        );
    }
    let mut waiting: Vec<String> = drivers
        .iter()
        .filter(|d| d.status.as_ref().map(|s| s.state) != Some(NvidiaDriverState::Ready))
        .map(|d| {
            let s = d.status.as_ref();
            let state = s.map_or("notReady", |s| state_name(s.state));
            let why = s
                .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Error"))
                .map(|c: &Condition| c.message.as_str())
                .filter(|m| !m.is_empty());
            match why {
                Some(m) => format!("NVIDIADriver {}: {state} ({m})", d.name_any()),
                None => format!("NVIDIADriver {}: {state}", d.name_any()),
            }
        })
        .collect();
    waiting.sort();
    if waiting.is_empty() {
        StateResult::Ready
    } else {
        StateResult::NotReady(waiting.join("; "))
    }
}

fn state_name(s: NvidiaDriverState) -> &'static str {
    match s {
        NvidiaDriverState::Ignored => "ignored",
        NvidiaDriverState::Ready => "ready",
        NvidiaDriverState::NotReady => "notReady",
        NvidiaDriverState::Disabled => "disabled",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use kiln_core::spec::nvidiadriver::{NvidiaDriverSpec, NvidiaDriverStatus};

    fn cr(name: &str, state: Option<NvidiaDriverState>, message: &str) -> NVIDIADriver {
        let mut d = NVIDIADriver::new(name, NvidiaDriverSpec::default());
        d.status = state.map(|state| NvidiaDriverStatus {
            state,
            namespace: None,
            conditions: vec![Condition {
                type_: "Error".into(),
                status: "True".into(),
                reason: "x".into(),
                message: message.into(),
                last_transition_time: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
                observed_generation: None,
            }],
        });
        d
    }

    #[test]
    fn policy_readiness_follows_every_nvidiadriver() {
        assert!(
            matches!(driver_result(std::iter::empty()), StateResult::NotReady(m) if m.contains("no NVIDIADriver"))
        );
        let ready = cr("a", Some(NvidiaDriverState::Ready), "");
        assert_eq!(
            driver_result(std::slice::from_ref(&ready)),
            StateResult::Ready
        );
        let waiting = cr("b", Some(NvidiaDriverState::NotReady), "pods unavailable");
        assert_eq!(
            driver_result(&[ready, waiting, cr("c", None, "")]),
            StateResult::NotReady(
                "NVIDIADriver b: notReady (pods unavailable); NVIDIADriver c: notReady".into()
            )
        );
    }
}
