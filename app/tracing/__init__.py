"""One OpenTelemetry trace per request, on Ray Serve's own tracing (DESIGN.md "Traces").

spans     the request path's spans: a switch read per request (`spans.ENABLED`), and while it is off every function
          returns at once with a shared null object: nothing of OpenTelemetry is touched per request
export    the span processors Serve's exporter hook returns: OTLP over HTTP or gRPC as the standard OTEL_* variables
          say, behind a bounded queue whose drops are counted, never a blocked request

Serve builds each process's TracerProvider and makes its own spans (the proxy's, `route_to_replica`,
`replica_handle_request`) and carries their context through deployment handles; the app's spans are children of those.
"""
