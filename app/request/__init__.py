"""What a request may be, checked before any work, for every protocol: byte counts, body reading and inflation
with their limits, top_k, the URL's length, the admin token, deadline arithmetic. Pure: no Ray, no Starlette."""
