//! Export macros (expand to nothing off wasm32).

/// The component's `name`, `validate-settings` and `transform` exports (wasm32 only; what the
/// `export_*!` macros expand to): `name()` returns `$name`; `validate-settings` evaluates
/// `$validate` (a `Vec<FieldError>`) with the plugin name and settings text bound to `$vplugin`
/// and `$vsettings`; `transform` converts the WIT context into a [`crate::TransformContext`]
/// bound to `$ctx` and a `CallMeta` bound to `$meta`, with the objects, spec and settings text
/// bound to `$objects`, `$spec` and `$settings`, evaluates `$body` (a
/// `Result<Vec<Outcome>, TransformError>`) and converts its result to WIT. Not meant to be
/// called directly.
#[doc(hidden)]
#[macro_export]
macro_rules! __export_guest {
    ($name:expr,
     validate: |$vplugin:ident, $vsettings:ident| $validate:expr,
     transform: |$objects:ident, $spec:ident, $settings:ident, $ctx:ident, $meta:ident| $body:expr) => {
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
                let ($ctx, $meta) = $crate::wasm::context_from_wit(ctx);
                $crate::wasm::result_to_wit($body)
            }
        }
        $crate::wasm::export_bindings!(KilnGuest with_types_in $crate::wasm);
    };
}

/// Export a standard [`crate::Operand`] as the component's `name` and `transform` (and a
/// `validate-settings` that accepts no settings).
///
/// Nothing is exported when the crate is compiled with `--cfg kiln_standard_bundle`: that is how
/// `kiln-bundled-plugins` builds the standard plugins into the one component of
/// [`export_standard_bundle!`](crate::export_standard_bundle), whose exports would otherwise
/// clash with each plugin's own.
#[macro_export]
macro_rules! export_operand {
    ($ty:ty) => {
        #[allow(unexpected_cfgs)]
        #[cfg(all(target_arch = "wasm32", not(kiln_standard_bundle)))]
        const _: () = {
            $crate::__export_guest!(<$ty as $crate::Operand>::NAME,
            validate: |plugin, settings| $crate::wasm::operand_settings(&settings),
            transform: |objects, spec, settings, ctx, meta| {
                $crate::run_operand::<$ty>(&objects, &spec, &ctx)
            });
        };
    };
}

/// Export a site plugin: `$name` is its name, `$f` a function with the signature of
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
            transform: |objects, spec, settings, ctx, meta| {
                $crate::transform_each(&objects, &spec, &ctx, $f)
            });
        };
    };
}

/// Export a [`crate::Plugin`] configured by settings: `validate-settings` parses and checks
/// them ([`crate::settings::validate_plugin`]), `transform` runs [`crate::settings::run_plugin`].
///
/// Like [`export_operand!`](crate::export_operand), it exports nothing under
/// `--cfg kiln_standard_bundle` (a bundled plugin is carried by the standard bundle).
#[macro_export]
macro_rules! export_plugin_with_settings {
    ($ty:ty) => {
        #[allow(unexpected_cfgs)]
        #[cfg(all(target_arch = "wasm32", not(kiln_standard_bundle)))]
        const _: () = {
            $crate::__export_guest!(<$ty as $crate::Plugin>::NAME,
            validate: |plugin, settings| $crate::settings::validate_plugin::<$ty>(&settings),
            transform: |objects, spec, settings, ctx, meta| {
                $crate::settings::run_plugin::<$ty>(
                    &objects, &spec, &settings, &ctx, &meta.policy_name, &meta.policy_annotations,
                )
            });
        };
    };
}

/// Export several standard [`crate::Operand`]s, and after `;` any [`crate::Plugin`]s, as one
/// component, a **standard bundle** (`kiln_core::context::STANDARD_BUNDLE_NAME`): `name()`
/// returns that name, and `transform` and `validate-settings` run the operand or plugin whose
/// `NAME` is the name the host loaded the bundle by (the context's `plugin`); any other name is a
/// `failed` error naming it. Build the crates with `--cfg kiln_standard_bundle` so that their own
/// export macros export nothing.
#[macro_export]
macro_rules! export_standard_bundle {
    ($($ty:ty),+ $(,)? $(; $($site:ty),+ $(,)?)?) => {
        #[cfg(target_arch = "wasm32")]
        const _: () = {
            $crate::__export_guest!($crate::STANDARD_BUNDLE_NAME,
                validate: |plugin, settings| {
                    $(
                        if plugin == <$ty as $crate::Operand>::NAME {
                            $crate::wasm::operand_settings(&settings)
                        } else
                    )+
                    $($(
                        if plugin == <$site as $crate::Plugin>::NAME {
                            $crate::settings::validate_plugin::<$site>(&settings)
                        } else
                    )+)?
                    {
                        vec![$crate::settings::FieldError::new(
                            "",
                            format!("the standard bundle carries no plugin {plugin:?}"),
                        )]
                    }
                },
                transform: |objects, spec, settings, ctx, meta| {
                    // An operand runs as itself, also in another state's chain.
                    let operand_ctx = $crate::TransformContext {
                        state: meta.plugin.clone(),
                        ..ctx.clone()
                    };
                    $(
                        if meta.plugin == <$ty as $crate::Operand>::NAME {
                            $crate::run_operand::<$ty>(&objects, &spec, &operand_ctx)
                        } else
                    )+
                    $($(
                        if meta.plugin == <$site as $crate::Plugin>::NAME {
                            $crate::settings::run_plugin::<$site>(
                                &objects, &spec, &settings, &ctx, &meta.policy_name, &meta.policy_annotations,
                            )
                        } else
                    )+)?
                    {
                        Err($crate::TransformError::Failed(format!(
                            "the standard bundle carries no plugin {:?}",
                            meta.plugin
                        )))
                    }
                });
        };
    };
}
