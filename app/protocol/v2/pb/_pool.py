"""The descriptor pool of the generated modules beside this one (python -m app.ops.proto_gen): their own, not
protobuf's default, so a process that also imports tritonclient's generated module of the same messages (the tests,
any client beside the app), of whatever version, holds both without a duplicate-name clash."""

from google.protobuf import descriptor_pool

POOL = descriptor_pool.DescriptorPool()
