//! Env var edits with upstream's ordering rule: a name that exists is updated in place, a new
//! name is appended (env order is observable; upstream `setContainerEnv`).

use k8s_openapi::api::core::v1::{Container, EnvVar};
use kiln_core::spec::EnvVarSpec;

/// Set `name=value` on `ctr`: replace the value in place (dropping any `valueFrom`) if `name`
/// exists, else append.
pub fn set_env(ctr: &mut Container, name: &str, value: impl Into<String>) {
    let value = value.into();
    let env = ctr.env.get_or_insert_with(Vec::new);
    match env.iter_mut().find(|e| e.name == name) {
        Some(e) => {
            e.value = Some(value);
            e.value_from = None;
        }
        None => env.push(EnvVar {
            name: name.to_string(),
            value: Some(value),
            value_from: None,
        }),
    }
}

/// Apply a user env list with [`set_env`], in list order.
pub fn apply_env(ctr: &mut Container, list: &[EnvVarSpec]) {
    for e in list {
        set_env(ctr, &e.name, e.value.clone());
    }
}

/// The plain value of env `name` on `ctr`, if set.
pub fn get_env<'a>(ctr: &'a Container, name: &str) -> Option<&'a str> {
    ctr.env
        .as_ref()?
        .iter()
        .find(|e| e.name == name)?
        .value
        .as_deref()
}

/// Remove env `name` from `ctr` if present.
pub fn remove_env(ctr: &mut Container, name: &str) {
    if let Some(env) = ctr.env.as_mut() {
        env.retain(|e| e.name != name);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn existing_names_update_in_place_new_names_append() {
        let mut c = Container::default();
        set_env(&mut c, "A", "1");
        set_env(&mut c, "B", "2");
        set_env(&mut c, "A", "3");
        let got: Vec<_> = c
            .env
            .unwrap()
            .into_iter()
            .map(|e| (e.name, e.value.unwrap()))
            .collect();
        assert_eq!(
            got,
            [("A".to_string(), "3".to_string()), ("B".into(), "2".into())]
        );
    }
}
