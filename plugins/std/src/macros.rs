//! Export macros of the standard plugins and the standard bundle (expand to nothing off
//! wasm32), through the SDK's export glue.

/// Export a standard [`crate::Operand`] as the component's `name` and `transform` (and a
/// `validate-settings` that accepts no settings, [`crate::operand_settings`]).
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
            $crate::__sdk::__export_guest!(<$ty as $crate::Operand>::NAME,
            validate: |plugin, settings| $crate::operand_settings(&settings),
            transform: |objects, spec, settings, ctx| {
                $crate::run_operand::<$ty>(&objects, &spec, &$crate::core_context(&ctx, &ctx.state))
            });
        };
    };
}

/// Export several standard [`crate::Operand`]s, and after `;` any SDK [`crate::Plugin`]s, as
/// one component, a **standard bundle** ([`crate::STANDARD_BUNDLE_NAME`]): `name()` returns that
/// name, and `transform` and `validate-settings` run the operand or plugin whose `NAME` is the
/// name the host loaded the bundle by (the context's `plugin`); any other name is a `failed`
/// error naming it. Build the crates with `--cfg kiln_standard_bundle` so that their own export
/// macros export nothing.
#[macro_export]
macro_rules! export_standard_bundle {
    ($($ty:ty),+ $(,)? $(; $($site:ty),+ $(,)?)?) => {
        #[cfg(target_arch = "wasm32")]
        const _: () = {
            $crate::__sdk::__export_guest!($crate::STANDARD_BUNDLE_NAME,
                validate: |plugin, settings| {
                    $(
                        if plugin == <$ty as $crate::Operand>::NAME {
                            $crate::operand_settings(&settings)
                        } else
                    )+
                    $($(
                        if plugin == <$site as $crate::Plugin>::NAME {
                            $crate::settings::validate_plugin::<$site>(&settings)
                        } else
                    )+)?
                    {
                        vec![$crate::FieldError::new(
                            "",
                            format!("the standard bundle carries no plugin {plugin:?}"),
                        )]
                    }
                },
                transform: |objects, spec, settings, ctx| {
                    $(
                        if ctx.plugin == <$ty as $crate::Operand>::NAME {
                            // An operand runs as itself, also in another state's chain.
                            $crate::run_operand::<$ty>(
                                &objects, &spec, &$crate::core_context(&ctx, &ctx.plugin),
                            )
                        } else
                    )+
                    $($(
                        if ctx.plugin == <$site as $crate::Plugin>::NAME {
                            $crate::settings::run_plugin::<$site>(&objects, &spec, &settings, &ctx)
                        } else
                    )+)?
                    {
                        Err($crate::TransformError::Failed(format!(
                            "the standard bundle carries no plugin {:?}",
                            ctx.plugin
                        )))
                    }
                });
        };
    };
}
