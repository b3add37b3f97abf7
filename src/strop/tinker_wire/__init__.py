"""`strop serve-tinker`: the tinker SDK's HTTP protocol over strop's engine (service, routes, protobuf codec,
tinker:// checkpoints). See `strop.tinker_wire.app` for the app (its routes are in the `routes_*` modules) and
`strop.tinker_wire.service` for what runs."""
