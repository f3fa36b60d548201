"""The one error root and the one status table.

Every failure the service reports is a `ServiceError` with a code from
`STATUS`; the HTTP layer turns it into `{"error": {"code", "message"}}` with the
status the table gives. Nothing else decides a status code.
"""

from __future__ import annotations

STATUS: dict[str, int] = {
    # 400: the bytes are not an image we can read
    "empty_body": 400,
    "undecodable_image": 400,
    "bad_multipart": 400,
    "missing_file": 400,
    "bad_request": 400,
    # 400: an Open Inference Protocol (/v2) tensor with the wrong name, datatype, shape or data length
    "invalid_tensor": 400,
    # 401: an admin endpoint without the right `Authorization: Bearer <admin token>`
    "unauthorized": 401,
    # 403: a request asked for something the config forbids
    "override_forbidden": 403,
    "admin_disabled": 403,  # an admin endpoint, and no admin token is configured
    # 404 / 405: no such route or model
    "not_found": 404,
    "method_not_allowed": 405,
    # 408: the request body did not arrive within RouterConfig.body_timeout_s (or a faster one needed its slot)
    "body_timeout": 408,
    # 409: a rollout is already running (start), or none is (abort)
    "conflict": 409,
    # 413: too big, by bytes, pixels or count
    "payload_too_large": 413,
    "too_many_pixels": 413,
    "too_many_files": 413,
    # 413: decoding the image would take more memory than the decode budget (Limits.max_decode_bytes)
    "decode_budget_exceeded": 413,
    # 414: the URL (path and query) is longer than Limits.max_url_bytes
    "uri_too_long": 414,
    # 415: not an image media type
    "unsupported_media_type": 415,
    # 415: an image format we read, in a variant we do not (e.g. a TIFF OpenCV decodes wrongly)
    "unsupported_image": 415,
    # 422: well-formed request, bad parameter value
    "invalid_parameter": 422,
    "unknown_variant": 422,
    # 429: one client (X-User-Id, or its address) has the admission front's max_per_client requests in flight
    # already (answered by HAProxy, `app.front.haproxy_config`, always with Retry-After)
    "too_many_requests": 429,
    # 503: try again later (always with Retry-After)
    "overloaded": 503,
    "inference_timeout": 503,
    "variant_unavailable": 503,
    "replica_failed": 503,
    "not_ready": 503,
    # 500: a bug in this service, never an input's fault; logged with its traceback
    "internal_error": 500,
}

RETRY_AFTER_S = 1


class ServiceError(Exception):
    """A failure with a stable machine-readable code and a human message."""

    def __init__(self, code: str, message: str, variant: str | None = None, allow: str | None = None) -> None:
        if code not in STATUS:
            raise ValueError(f"unknown error code {code!r}")
        super().__init__(message)
        self.code = code
        self.message = message
        self.variant = variant  # the variant that failed, where one did (metrics and the A/B ledger count it)
        self.allow = allow  # a 405's methods (RFC 9110: the Allow header), where the path is known

    @property
    def status(self) -> int:
        return STATUS[self.code]

    @property
    def retryable(self) -> bool:
        return self.status in (429, 503)

    def body(self) -> dict[str, dict[str, str]]:
        return {"error": {"code": self.code, "message": self.message}}

    def headers(self) -> dict[str, str]:
        if self.status == 401:
            return {"WWW-Authenticate": 'Bearer realm="admin"'}  # RFC 9110: a 401 names its scheme
        if self.status == 405 and self.allow:
            return {"Allow": self.allow}  # RFC 9110: a 405 names the methods the resource takes
        return {"Retry-After": str(RETRY_AFTER_S)} if self.retryable else {}

    def __reduce__(self) -> tuple[type[ServiceError], tuple[str, str, str | None, str | None]]:
        # Crosses Ray's object store: keep it picklable with every field.
        return (type(self), (self.code, self.message, self.variant, self.allow))


class ImageInputError(ServiceError):
    """The request's image cannot be used (empty, undecodable, too large)."""


def find_service_error(exc: BaseException) -> ServiceError | None:
    """The ServiceError behind an exception that crossed Ray (RayTaskError wraps it as `.cause`)."""
    seen = 0
    cur: BaseException | None = exc
    while cur is not None and seen < 8:
        if isinstance(cur, ServiceError):
            return ServiceError(cur.code, cur.message, cur.variant)
        cur = getattr(cur, "cause", None) or cur.__cause__
        seen += 1
    return None
