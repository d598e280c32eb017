//! Export macros (expand to nothing off wasm32).

/// The component's `name` and `transform` exports (wasm32 only; what the `export_*!` macros
/// expand to): `name()` returns `$name`; `transform` converts the WIT context into a
/// [`crate::TransformContext`] bound to `$ctx`, with the objects and spec text bound to
/// `$objects` and `$spec`, evaluates `$body` (a `Result<Vec<Outcome>, TransformError>`) and
/// converts its result to WIT. Not meant to be called directly.
#[doc(hidden)]
#[macro_export]
macro_rules! __export_guest {
    ($name:expr, |$objects:ident, $spec:ident, $ctx:ident| $body:expr) => {
        struct KilnGuest;
        impl $crate::wasm::Guest for KilnGuest {
            fn name() -> String {
                ($name).to_string()
            }
            fn transform(
                $objects: Vec<String>,
                $spec: String,
                ctx: $crate::wasm::Context,
            ) -> Result<Vec<$crate::wasm::WitOutcome>, $crate::wasm::WitError> {
                let $ctx = $crate::wasm::context_from_wit(ctx);
                $crate::wasm::result_to_wit($body)
            }
        }
        $crate::wasm::export_bindings!(KilnGuest with_types_in $crate::wasm);
    };
}

/// Export a standard [`crate::Operand`] as the component's `name` and `transform`.
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
            $crate::__export_guest!(<$ty as $crate::Operand>::NAME, |objects, spec, ctx| {
                $crate::run_operand::<$ty>(&objects, &spec, &ctx)
            });
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
            $crate::__export_guest!($name, |objects, spec, ctx| {
                $crate::transform_each(&objects, &spec, &ctx, $f)
            });
        };
    };
}

/// Export several standard [`crate::Operand`]s as one component, a **standard bundle**
/// (`kiln_core::context::STANDARD_BUNDLE_NAME`): `name()` returns that name, and `transform`
/// runs the operand whose [`crate::Operand::NAME`] is the context's `state`, which the host sets
/// to the name the bundle was loaded by; any other name is a `failed` error naming it. Build the
/// operands' crates with `--cfg kiln_standard_bundle` so that their own
/// [`export_operand!`](crate::export_operand) exports nothing.
#[macro_export]
macro_rules! export_standard_bundle {
    ($($ty:ty),+ $(,)?) => {
        #[cfg(target_arch = "wasm32")]
        const _: () = {
            $crate::__export_guest!($crate::STANDARD_BUNDLE_NAME, |objects, spec, ctx| {
                $(
                    if ctx.state == <$ty as $crate::Operand>::NAME {
                        $crate::run_operand::<$ty>(&objects, &spec, &ctx)
                    } else
                )+ {
                    Err($crate::TransformError::Failed(format!(
                        "the standard bundle carries no plugin {:?}",
                        ctx.state
                    )))
                }
            });
        };
    };
}
