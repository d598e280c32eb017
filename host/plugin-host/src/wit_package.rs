//! The WIT packages the host loads, as **binary WIT packages**: the component-model encoding of
//! a package's types and worlds (no code), the artifact `wasm-tools component wit --wasm` and
//! `wkg wit build` write and a registry serves under `application/wasm`, so that component
//! tooling (`wkg`, `wit-bindgen`, `wasm-tools`, componentize-py/-js) can take `kiln:operand` as a
//! dependency without kiln's sources.
//!
//! The texts are the repository's `wit/operand.wit` (`0.2.0`) and `wit/v0.1.0/operand.wit`
//! (`0.1.0`), the same files the host's bindings are generated from.

use wit_component::DecodedWasm;

/// Every version of `kiln:operand` the host loads, newest first, with its WIT text.
pub const WIT_PACKAGES: &[(&str, &str)] = &[
    ("0.2.0", include_str!("../../../wit/operand.wit")),
    ("0.1.0", include_str!("../../../wit/v0.1.0/operand.wit")),
];

/// The namespace and name of the package (`kiln:operand`).
pub const WIT_PACKAGE_NAME: &str = "kiln:operand";

/// What a binary WIT package declares: `namespace:name@version` and its worlds, sorted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WitPackageInfo {
    /// `kiln:operand@0.2.0`.
    pub package: String,
    /// World names, sorted (`operand-transform`, …).
    pub worlds: Vec<String>,
    /// Interface names, sorted (`types`).
    pub interfaces: Vec<String>,
}

/// The binary WIT package of `kiln:operand@<version>`.
///
/// # Errors
/// A version the host does not load (the message lists those it does), or a WIT text that does
/// not parse or encode (a bug caught by this module's tests).
pub fn encode_wit_package(version: &str) -> Result<Vec<u8>, String> {
    let (_, text) = WIT_PACKAGES
        .iter()
        .find(|(v, _)| *v == version)
        .ok_or_else(|| {
            let known: Vec<&str> = WIT_PACKAGES.iter().map(|(v, _)| *v).collect();
            format!(
                "{WIT_PACKAGE_NAME}@{version} is not a version kiln loads (known: {})",
                known.join(", ")
            )
        })?;
    let mut resolve = wit_parser::Resolve::default();
    let pkg = resolve
        .push_str(format!("kiln-operand-{version}/operand.wit"), text)
        .map_err(|e| format!("{WIT_PACKAGE_NAME}@{version}: {e:#}"))?;
    wit_component::encode(&resolve, pkg).map_err(|e| format!("{WIT_PACKAGE_NAME}@{version}: {e:#}"))
}

/// Reads a binary WIT package back: its name, version and worlds.
///
/// # Errors
/// Bytes that are not a binary WIT package (a component with code is refused too).
pub fn decode_wit_package(bytes: &[u8]) -> Result<WitPackageInfo, String> {
    match wit_component::decode(bytes).map_err(|e| format!("not a WIT package: {e:#}"))? {
        DecodedWasm::WitPackage(resolve, pkg) => {
            let package = &resolve.packages[pkg];
            let mut worlds: Vec<String> = package.worlds.keys().cloned().collect();
            worlds.sort();
            let mut interfaces: Vec<String> = package.interfaces.keys().cloned().collect();
            interfaces.sort();
            Ok(WitPackageInfo {
                package: package.name.to_string(),
                worlds,
                interfaces,
            })
        }
        DecodedWasm::Component(..) => {
            Err("a component, not a WIT package (it has code)".to_string())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each version encodes to a binary WIT package that decodes back to its name, version
    /// and worlds (0.2.0 adds `operand-transform-validated`); an unknown version is refused
    /// with the known ones listed.
    #[test]
    fn every_version_round_trips_with_its_worlds() {
        let expected = [
            (
                "0.2.0",
                vec!["operand-transform", "operand-transform-validated"],
            ),
            ("0.1.0", vec!["operand-transform"]),
        ];
        assert_eq!(WIT_PACKAGES.len(), expected.len());
        for (version, worlds) in expected {
            let bytes = encode_wit_package(version).unwrap();
            // A component-model binary (`\0asm`, layer 1), not a core module.
            assert_eq!(&bytes[..4], b"\0asm");
            assert_eq!(&bytes[6..8], &[1, 0], "component layer");
            let info = decode_wit_package(&bytes).unwrap();
            assert_eq!(info.package, format!("kiln:operand@{version}"));
            assert_eq!(info.worlds, worlds);
            assert_eq!(info.interfaces, ["types"]);
            assert!(
                wasmparser::Validator::new_with_features(wasmparser::WasmFeatures::all())
                    .validate_all(&bytes)
                    .is_ok(),
                "{version}: the package validates as a component"
            );
        }
        let err = encode_wit_package("0.3.0").unwrap_err();
        assert!(err.contains("known: 0.2.0, 0.1.0"), "{err}");
        assert!(decode_wit_package(b"\0asm\x01\0\0\0").is_err());
    }

    /// The header of each WIT text names the version it is listed under.
    #[test]
    fn texts_declare_their_versions() {
        for (version, text) in WIT_PACKAGES {
            assert!(
                text.contains(&format!("\npackage {WIT_PACKAGE_NAME}@{version};")),
                "{version}"
            );
        }
    }
}
