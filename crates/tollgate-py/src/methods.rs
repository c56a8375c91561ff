//! [`core_methods!`]: the part of a Python class's `#[pymethods]` that comes from the core it
//! wraps, written once for the four Redis classes (`Semaphore` and `TokenBucket`, and their
//! blocking twins in `tollgate.sync`, each pair over one core).

/// The `#[pymethods]` of `$class`, a newtype over `$core`: the constructor (`$core::new` with
/// the arguments and pyo3 `signature` given), one getter per name given (each the core's method
/// of that name, with the doc comment given), and `repr` (`$core::repr`, naming the class
/// `$repr`), around the class's own methods.
macro_rules! core_methods {
    (
        $class:ident, $repr:literal, $core:path;
        new $signature:tt ($($arg:ident: $ty:ty),* $(,)?);
        getters { $($(#[doc = $doc:literal])* $getter:ident -> $ret:ty;)* }
        $($methods:tt)*
    ) => {
        #[::pyo3::pymethods]
        impl $class {
            #[new]
            #[pyo3(signature = $signature)]
            fn new($($arg: $ty),*) -> ::pyo3::PyResult<$class> {
                <$core>::new($($arg),*).map($class)
            }

            $($methods)*

            $(
                $(#[doc = $doc])*
                #[getter]
                fn $getter(&self) -> $ret {
                    self.0.$getter()
                }
            )*

            fn __repr__(&self) -> String {
                self.0.repr($repr)
            }
        }
    };
}
pub(crate) use core_methods;
