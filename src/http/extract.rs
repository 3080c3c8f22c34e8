//! The API's extractors: what a handler needs, checked before it runs and refused as the API
//! answers (`ApiError`'s JSON), never with axum's plain-text rejections. Extractors run in
//! the order of the handler's parameters, so an [`Admin`] before a path means a user's token
//! gets its 403 before a malformed path gets its 400.

use std::marker::PhantomData;
use std::sync::Arc;

use axum::extract::{FromRequestParts, Path, Query};
use axum::http::request::Parts;
use serde::de::DeserializeOwned;

use super::error::ApiError;
use super::guard::Principal;

/// A path's parameters; malformed ones are a 400.
pub(crate) struct ApiPath<T>(pub(crate) T);

/// A query string; a malformed one (or an unknown parameter, with `deny_unknown_fields`) is a
/// 400.
pub(crate) struct ApiQuery<T>(pub(crate) T);

/// An admin-only API: what a user's token is told instead.
pub(crate) trait AdminApi {
    /// The 403's message: what the API is and where users find their part of it.
    const HINT: &'static str;
}

/// Proof that the caller may use the admin-only API `A`: an admin token, or a token-less API
/// (loopback only), whose every caller is the operator. Anyone else gets a 403 with
/// [`AdminApi::HINT`].
pub(crate) struct Admin<A>(PhantomData<A>);

impl<S, T> FromRequestParts<S> for ApiPath<T>
where
    T: DeserializeOwned + Send,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        Path::<T>::from_request_parts(parts, state)
            .await
            .map(|Path(value)| Self(value))
            .map_err(|e| ApiError::BadRequest(e.body_text()))
    }
}

impl<S, T> FromRequestParts<S> for ApiQuery<T>
where
    T: DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        Query::<T>::from_request_parts(parts, state)
            .await
            .map(|Query(value)| Self(value))
            .map_err(|e| ApiError::BadRequest(e.body_text()))
    }
}

impl<S, A> FromRequestParts<S> for Admin<A>
where
    A: AdminApi,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, ApiError> {
        // The guard puts the principal on every API request; without it the route was
        // mounted outside the guard, which must fail closed.
        let principal = parts
            .extensions
            .get::<Arc<Principal>>()
            .ok_or_else(|| ApiError::Internal("an API route without its guard".to_owned()))?;
        principal.require_admin(A::HINT)?;
        Ok(Self(PhantomData))
    }
}

#[cfg(test)]
mod tests {
    use axum::response::IntoResponse;

    use super::*;

    struct Ops;

    impl AdminApi for Ops {
        const HINT: &'static str = "ops needs an admin token";
    }

    fn parts(uri: &str, principal: Option<Principal>) -> Parts {
        let mut request = axum::http::Request::builder().uri(uri).body(()).unwrap();
        if let Some(principal) = principal {
            request.extensions_mut().insert(Arc::new(principal));
        }
        request.into_parts().0
    }

    #[tokio::test]
    async fn admins_pass_users_get_the_apis_hint_and_a_route_without_its_guard_fails_closed() {
        let admin = Principal { user: None };
        let mut request = parts("/", Some(admin));
        assert!(
            Admin::<Ops>::from_request_parts(&mut request, &())
                .await
                .is_ok()
        );

        let user = Principal {
            user: Some("ada".to_owned()),
        };
        let mut request = parts("/", Some(user));
        let refused = Admin::<Ops>::from_request_parts(&mut request, &())
            .await
            .err()
            .unwrap();
        assert!(matches!(&refused, ApiError::Forbidden(hint) if hint == Ops::HINT));
        assert_eq!(refused.into_response().status(), 403);

        let mut request = parts("/", None);
        let unguarded = Admin::<Ops>::from_request_parts(&mut request, &())
            .await
            .err()
            .unwrap();
        assert_eq!(unguarded.into_response().status(), 500);
    }

    #[derive(Debug, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Limit {
        limit: u32,
    }

    #[tokio::test]
    async fn a_malformed_query_is_the_apis_400() {
        let mut request = parts("/?limit=7", None);
        let ApiQuery(query) = ApiQuery::<Limit>::from_request_parts(&mut request, &())
            .await
            .ok()
            .unwrap();
        assert_eq!(query.limit, 7);
        for bad in ["/?limit=many", "/?limit=1&extra=2", "/"] {
            let mut request = parts(bad, None);
            let refused = ApiQuery::<Limit>::from_request_parts(&mut request, &())
                .await
                .err()
                .unwrap();
            assert!(matches!(refused, ApiError::BadRequest(_)), "{bad}");
            let response = refused.into_response();
            assert_eq!(response.status(), 400, "{bad}");
            assert_eq!(
                response.headers()[axum::http::header::CONTENT_TYPE],
                "application/json",
                "{bad}"
            );
        }
    }
}
