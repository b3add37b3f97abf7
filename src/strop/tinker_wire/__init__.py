"""`strop serve-tinker`: the tinker SDK's HTTP protocol over strop's engine (service, routes, protobuf codec,
tinker:// checkpoints). See `strop.tinker_wire.app` for the routes and `strop.tinker_wire.service` for what runs."""
