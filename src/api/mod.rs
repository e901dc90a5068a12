//! The public API: the client and its builder, the lock and its guard, the multi-lock, the
//! fenced resource, the leadership election, the semaphore and the read-write lock, jobs and
//! idempotency keys. Each file holds one of them; what the handles of holds share (options,
//! the acquisition request, the acquire calls) is `handle.rs`, and what everything shares (ids,
//! connection, waiting, renewal, undo) is the engine's.

/// Writes setters that store one value in one field (`field` or `field.inner`) and return
/// `self`, each from its doc and attributes and `fn name(arg: Type) -> Self => field;` (the
/// argument stored as it is) or `fn name(arg: Type, ...) -> Self => field = value;` (`value`
/// made from the arguments).
macro_rules! setters {
    ($(
        $(#[$attr:meta])*
        fn $name:ident($($arg:ident: $ty:ty),+) -> $ret:ty => $($field:ident).+ $(= $value:expr)?;
    )*) => {$(
        $(#[$attr])*
        pub fn $name(mut self, $($arg: $ty),+) -> $ret {
            self.$($field).+ = setters!(@value [$($arg),+] $(, $value)?);
            self
        }
    )*};
    (@value [$arg:ident]) => { $arg };
    (@value [$($arg:ident),+], $value:expr) => { $value };
}

/// Writes getters, each from its doc and attributes and `fn name(&self) -> Type => field;` (a
/// copy of the field) or `fn name(&self) -> Type => value;` (`value` an expression of `self`:
/// a borrow of a field, a call passed on to one).
macro_rules! getters {
    ($(
        $(#[$attr:meta])*
        fn $name:ident(&self) -> $ret:ty => $field:ident;
    )*) => {$(
        $(#[$attr])*
        pub fn $name(&self) -> $ret {
            self.$field
        }
    )*};
    ($(
        $(#[$attr:meta])*
        fn $name:ident(&$this:ident) -> $ret:ty => $value:expr;
    )*) => {$(
        $(#[$attr])*
        pub fn $name(&$this) -> $ret {
            $value
        }
    )*};
}

/// Writes `Debug` for each type named as a struct of the type's name with the fields given,
/// each `field: value` with `$this` the value shown, and `..` after them for a type that shows
/// only part of itself (`finish_non_exhaustive`).
macro_rules! debug_struct {
    ($ty:ident($this:ident) { $($field:ident: $value:expr),* $(,)? } $($more:tt)?) => {
        impl std::fmt::Debug for $ty {
            fn fmt(&$this, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                let mut debug = f.debug_struct(stringify!($ty));
                $(debug.field(stringify!($field), &$value);)*
                debug_struct!(@finish debug $($more)?)
            }
        }
    };
    ($ty:ident, $($others:ident),+ ($this:ident) $($fields:tt)*) => {
        debug_struct!($ty($this) $($fields)*);
        debug_struct!($($others),+ ($this) $($fields)*);
    };
    (@finish $debug:ident) => { $debug.finish() };
    (@finish $debug:ident ..) => { $debug.finish_non_exhaustive() };
}

pub(crate) mod builder;
pub(crate) mod client;
pub(crate) mod election;
pub(crate) mod guard;
pub(crate) mod handle;
pub(crate) mod idempotency;
pub(crate) mod job;
pub(crate) mod lock;
pub(crate) mod multi;
pub(crate) mod resource;
pub(crate) mod rwlock;
pub(crate) mod semaphore;
