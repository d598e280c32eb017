//! Export macros (expand to nothing off wasm32).

/// The component's `name`, `validate-settings` and `transform` exports (wasm32 only; what the
/// `export_*!` macros expand to): `name()` returns `$name`; `validate-settings` evaluates
/// `$validate` (a `Vec<FieldError>`) with the plugin name and settings text bound to `$vplugin`
/// and `$vsettings`; `transform` converts the WIT context into a [`crate::Context`] bound to
/// `$ctx`, with the objects, spec and settings text bound to `$objects`, `$spec` and
/// `$settings`, evaluates `$body` (a `Result<Vec<Outcome>, TransformError>`) and converts its
/// result to WIT. Not meant to be called directly.
#[doc(hidden)]
#[macro_export]
macro_rules! __export_guest {
    ($name:expr,
     validate: |$vplugin:ident, $vsettings:ident| $validate:expr,
     transform: |$objects:ident, $spec:ident, $settings:ident, $ctx:ident| $body:expr) => {
        struct KilnGuest;
        impl $crate::wasm::Guest for KilnGuest {
            fn name() -> String {
                ($name).to_string()
            }
            #[allow(unused_variables)]
            fn validate_settings(
                $vplugin: String,
                $vsettings: String,
            ) -> Result<(), Vec<$crate::wasm::WitFieldError>> {
                $crate::wasm::settings_to_wit($validate)
            }
            #[allow(unused_variables)]
            fn transform(
                $objects: Vec<String>,
                $spec: String,
                $settings: String,
                ctx: $crate::wasm::Context,
            ) -> Result<Vec<$crate::wasm::WitOutcome>, $crate::wasm::WitError> {
                let $ctx = $crate::wasm::context_from_wit(ctx);
                $crate::wasm::result_to_wit($body)
            }
        }
        $crate::wasm::export_bindings!(KilnGuest with_types_in $crate::wasm);
    };
}

/// Export a plugin: `$name` is its name, `$f` a function with the signature of
/// [`crate::transform_each`]'s edit callback, run on every object. It accepts any settings and
/// ignores them; a plugin configured by settings implements [`crate::Plugin`] and uses
/// [`export_plugin_with_settings!`](crate::export_plugin_with_settings).
#[macro_export]
macro_rules! export_plugin {
    ($name:expr, $f:path) => {
        #[cfg(target_arch = "wasm32")]
        const _: () = {
            $crate::__export_guest!($name,
            validate: |plugin, settings| Vec::new(),
            transform: |objects, spec, settings, ctx| {
                $crate::transform_each(&objects, &spec, &ctx, $f)
            });
        };
    };
}

/// Export a [`crate::Plugin`] configured by settings: `validate-settings` parses and checks
/// them ([`crate::settings::validate_plugin`]), `transform` runs [`crate::settings::run_plugin`].
///
/// It exports nothing when the crate is compiled with `--cfg kiln_standard_bundle`: kiln builds
/// its bundled plugins that way into one component (a standard bundle) whose exports would
/// otherwise clash with the plugin's own.
#[macro_export]
macro_rules! export_plugin_with_settings {
    ($ty:ty) => {
        #[allow(unexpected_cfgs)]
        #[cfg(all(target_arch = "wasm32", not(kiln_standard_bundle)))]
        const _: () = {
            $crate::__export_guest!(<$ty as $crate::Plugin>::NAME,
            validate: |plugin, settings| $crate::settings::validate_plugin::<$ty>(&settings),
            transform: |objects, spec, settings, ctx| {
                $crate::settings::run_plugin::<$ty>(&objects, &spec, &settings, &ctx)
            });
        };
    };
}
