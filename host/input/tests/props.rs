//! Properties of the bounded inputs over arbitrary text: no panic, and every result within the
//! documented bounds.

use proptest::prelude::*;

use kiln_input::{
    MAX_DURATION,
    k8s::{is_label_value, sanitize_label_value},
    parse_go_duration, yaml,
};

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn any_text_loads_or_fails_with_a_path(text in "(?s).{0,400}") {
        if let Err(e) = yaml::to_value(&text) {
            prop_assert!(!e.path.is_empty() && !e.message.is_empty());
        }
    }

    #[test]
    fn yaml_shaped_text_never_panics(
        parts in prop::collection::vec(prop_oneof![
            Just("a: "), Just("- "), Just("["), Just("]"), Just("{"), Just("}"), Just(", "),
            Just("\n"), Just("  "), Just("'"), Just("\""), Just("#"), Just("&x "), Just("*x"),
            Just("1"), Just("99999999999999999999999"), Just("b: "), Just("? "), Just("|\n"),
            Just("!t "), Just(".nan"), Just("a: 1\na: 2\n"),
        ], 0..60)
    ) {
        let text: String = parts.concat();
        if let Err(e) = yaml::to_value(&text) {
            prop_assert!(!e.path.is_empty(), "{e}");
        }
    }

    #[test]
    fn durations_never_panic_and_stay_in_bounds(
        s in prop_oneof!["[0-9.]{0,30}(ns|us|µs|ms|s|m|h|d|)", "[0-9]{0,25}h[0-9]{0,25}m", ".{0,20}"]
    ) {
        if let Ok(d) = parse_go_duration(&s, MAX_DURATION) {
            prop_assert!(d <= MAX_DURATION);
        }
    }

    #[test]
    fn sanitised_label_values_are_valid(raw in "(?s).{0,200}") {
        if let Some(v) = sanitize_label_value(&raw) {
            prop_assert!(is_label_value(&v), "{raw:?} -> {v:?}");
        }
    }
}
