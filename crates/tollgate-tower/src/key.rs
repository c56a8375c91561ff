//! Which bucket a request counts against: key extractors.

use std::hash::Hash;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use http::{Extensions, HeaderMap, HeaderName, Method, Uri};

use crate::proxy::TrustedProxies;

/// The parts of a request a key or cost is computed from (borrowed, no copies).
#[derive(Clone, Copy, Debug)]
pub struct RequestInfo<'a> {
    /// The request method.
    pub method: &'a Method,
    /// The request URI.
    pub uri: &'a Uri,
    /// The request headers.
    pub headers: &'a HeaderMap,
    /// The request extensions (peer address, matched route, authenticated identity, ...).
    pub extensions: &'a Extensions,
}

impl<'a> RequestInfo<'a> {
    /// Borrows the parts of `req`.
    pub fn of<B>(req: &'a http::Request<B>) -> Self {
        RequestInfo { method: req.method(), uri: req.uri(), headers: req.headers(), extensions: req.extensions() }
    }

    /// The TCP peer's address: axum's `ConnectInfo<SocketAddr>` or a bare `SocketAddr` extension.
    #[inline]
    pub fn peer(&self) -> Option<SocketAddr> {
        #[cfg(feature = "axum")]
        if let Some(info) = self.extensions.get::<axum::extract::ConnectInfo<SocketAddr>>() {
            return Some(info.0);
        }
        self.extensions.get::<SocketAddr>().copied()
    }
}

/// Computes the key a request is limited under; `None` when the request has none (what happens
/// then is the policy's [`crate::MissingKey`] choice).
pub trait KeyExtractor: Clone + Send + Sync + 'static {
    /// The key type.
    type Key: Hash + Eq + Clone + Send + Sync + 'static;

    /// The key of this request.
    fn extract(&self, req: &RequestInfo<'_>) -> Option<Self::Key>;
}

/// One bucket for everyone (a global limit).
#[derive(Clone, Copy, Debug, Default)]
pub struct Global;

impl KeyExtractor for Global {
    type Key = ();
    fn extract(&self, _req: &RequestInfo<'_>) -> Option<()> {
        Some(())
    }
}

/// The client's IP address: the TCP peer, or — only when the peer is a trusted proxy — the
/// address the proxies report in `Forwarded` / `X-Forwarded-For` (the right-most one that is not
/// itself a trusted proxy, so a client cannot spoof its way past them).
///
/// ```
/// use tollgate_tower::ClientIp;
/// let key = ClientIp::new().trust_proxies(["10.0.0.0/8", "::1/128"]).unwrap();
/// # let _ = key;
/// ```
#[derive(Clone, Debug, Default)]
pub struct ClientIp {
    trusted: Arc<TrustedProxies>,
}

impl ClientIp {
    /// The TCP peer's address; forwarding headers are ignored.
    pub fn new() -> Self {
        Self::default()
    }

    /// Honours forwarding headers when the peer is in one of these networks (CIDR, or a bare
    /// address). An unparsable entry is an error naming it.
    pub fn trust_proxies<I, S>(self, networks: I) -> Result<Self, crate::ConfigError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        Ok(ClientIp { trusted: Arc::new(TrustedProxies::parse(networks)?) })
    }
}

impl KeyExtractor for ClientIp {
    type Key = IpAddr;
    // Inlined into the decision: an `IpAddr` (17 bytes, odd-sized copies) then stays in registers.
    #[inline]
    fn extract(&self, req: &RequestInfo<'_>) -> Option<IpAddr> {
        let peer = req.peer()?.ip();
        Some(self.trusted.client_ip(peer, req.headers))
    }
}

/// The value of a request header (e.g. an API key); requests without it have no key.
#[derive(Clone, Debug)]
pub struct Header(HeaderName);

impl Header {
    /// Keys requests by the value of `name`.
    pub fn new(name: HeaderName) -> Self {
        Header(name)
    }
}

impl KeyExtractor for Header {
    type Key = bytes::Bytes;
    fn extract(&self, req: &RequestInfo<'_>) -> Option<bytes::Bytes> {
        req.headers.get(&self.0).map(|v| bytes::Bytes::copy_from_slice(v.as_bytes()))
    }
}

/// The route the request matched (axum's `MatchedPath`, e.g. `/users/{id}`), so each route has
/// its own bucket whatever the path parameters.
#[cfg(feature = "axum")]
#[derive(Clone, Copy, Debug, Default)]
pub struct Route;

#[cfg(feature = "axum")]
impl KeyExtractor for Route {
    type Key = Arc<str>;
    fn extract(&self, req: &RequestInfo<'_>) -> Option<Arc<str>> {
        req.extensions.get::<axum::extract::MatchedPath>().map(|p| Arc::from(p.as_str()))
    }
}

/// A value an earlier layer put in the request extensions, e.g. the authenticated user or tenant.
#[derive(Debug)]
pub struct Extension<T>(std::marker::PhantomData<fn() -> T>);

impl<T> Extension<T> {
    /// Keys requests by their `T` extension.
    pub fn new() -> Self {
        Extension(std::marker::PhantomData)
    }
}

impl<T> Default for Extension<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T> Clone for Extension<T> {
    fn clone(&self) -> Self {
        Self::new()
    }
}

impl<T: Hash + Eq + Clone + Send + Sync + 'static> KeyExtractor for Extension<T> {
    type Key = T;
    fn extract(&self, req: &RequestInfo<'_>) -> Option<T> {
        req.extensions.get::<T>().cloned()
    }
}

/// Any function of the request.
///
/// ```
/// use tollgate_tower::{KeyFn, RequestInfo};
/// let by_tenant = KeyFn::new(|req: &RequestInfo<'_>| {
///     req.uri.path().strip_prefix("/t/")?.split('/').next().map(str::to_owned)
/// });
/// # let _ = by_tenant;
/// ```
pub struct KeyFn<F>(Arc<F>);

impl<F> KeyFn<F> {
    /// Wraps `f`.
    pub fn new(f: F) -> Self {
        KeyFn(Arc::new(f))
    }
}

impl<F> std::fmt::Debug for KeyFn<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("KeyFn").finish_non_exhaustive()
    }
}

impl<F> Clone for KeyFn<F> {
    fn clone(&self) -> Self {
        KeyFn(self.0.clone())
    }
}

impl<F, K> KeyExtractor for KeyFn<F>
where
    F: Fn(&RequestInfo<'_>) -> Option<K> + Send + Sync + 'static,
    K: Hash + Eq + Clone + Send + Sync + 'static,
{
    type Key = K;
    fn extract(&self, req: &RequestInfo<'_>) -> Option<K> {
        (self.0)(req)
    }
}
