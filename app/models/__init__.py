"""`python -m app.models`: the offline model toolchain's command line (`app.models.cli`; the code is
`app.toolchain`, the serving-time model contract `app.served_model`)."""
