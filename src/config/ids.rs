//! The ids a compiled config refers to its parts by: a route, a policy, a consumer,
//! an upstream. Each is the index of the part in its list in [`super::Config`], typed
//! so that one cannot stand for another.

/// Declares an id: a `u32` index into one of the config's lists.
macro_rules! id {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(u32);

        impl $name {
            /// The id of the part at `index` of its list.
            pub(crate) fn new(index: usize) -> $name {
                $name(u32::try_from(index).expect("fewer than 2^32 parts of a kind"))
            }

            /// The part's index in its list.
            pub(crate) fn index(self) -> usize {
                self.0 as usize
            }

            /// Every id of a list of `len` parts, in order.
            #[allow(dead_code, reason = "not every kind of part is listed whole")]
            pub(crate) fn all(len: usize) -> impl Iterator<Item = $name> + use<> {
                (0..len).map($name::new)
            }
        }
    };
}

id!(
    /// A route: its index in [`super::Config::routes`], which is the match order.
    RouteId
);
id!(
    /// A policy: its index in [`super::Config::policies`].
    PolicyId
);
id!(
    /// A configured consumer: its index in [`super::Config::consumers`].
    ConsumerId
);
id!(
    /// An upstream: its index in [`super::Config::upstreams`].
    UpstreamId
);
