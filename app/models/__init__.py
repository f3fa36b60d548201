"""`python -m app.models`: the offline model toolchain's command line (app/ops/models_cli.py; the code is
app/toolchain/, the serving-time model contract app/model/)."""
