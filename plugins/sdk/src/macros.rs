//! Export macros (expand to nothing off wasm32).

/// Export a standard [`crate::Operand`] as the component's `name` and `transform`.
#[macro_export]
macro_rules! export_operand {
    ($ty:ty) => {
        #[cfg(target_arch = "wasm32")]
        const _: () = {
            struct KilnGuest;
            impl $crate::wasm::Guest for KilnGuest {
                fn name() -> String {
                    <$ty as $crate::Operand>::NAME.to_string()
                }
                fn transform(
                    objects: Vec<String>,
                    spec: String,
                    ctx: $crate::wasm::Context,
                ) -> Result<Vec<$crate::wasm::WitOutcome>, $crate::wasm::WitError> {
                    let ctx = $crate::wasm::context_from_wit(ctx);
                    $crate::wasm::result_to_wit($crate::run_operand::<$ty>(&objects, &spec, &ctx))
                }
            }
    $crate::wasm::export_bindings!(KilnGuest with_types_in $crate::wasm);
        };
    };
}

/// Export a site plugin: `$name` is its name, `$f` a function with the signature of
/// [`crate::transform_each`]'s edit callback, run on every object.
#[macro_export]
macro_rules! export_plugin {
    ($name:expr, $f:path) => {
        #[cfg(target_arch = "wasm32")]
        const _: () = {
            struct KilnGuest;
            impl $crate::wasm::Guest for KilnGuest {
                fn name() -> String {
                    ($name).to_string()
                }
                fn transform(
                    objects: Vec<String>,
                    spec: String,
                    ctx: $crate::wasm::Context,
                ) -> Result<Vec<$crate::wasm::WitOutcome>, $crate::wasm::WitError> {
                    let ctx = $crate::wasm::context_from_wit(ctx);
                    $crate::wasm::result_to_wit($crate::transform_each(&objects, &spec, &ctx, $f))
                }
            }
    $crate::wasm::export_bindings!(KilnGuest with_types_in $crate::wasm);
        };
    };
}
