//! The protocols: each reads its requests, asks the [`Engine`](crate::serve::Engine), and answers
//! in its own terms, without framing: Envoy's and Kuadrant's gRPC services ([`rls`], the method
//! table `methods`), Envoy's rate limit quota service ([`rlqs`]), the HTTP API ([`http`]) and the RateLimit headers both may carry
//! ([`headers`]). How the bytes travel is `net`'s.

pub mod headers;
pub mod http;
pub(crate) mod metadata;
pub(crate) mod methods;
pub mod rlqs;
pub mod rls;
