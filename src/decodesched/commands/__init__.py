"""One module per `decodesched` subcommand (see `decodesched.cli`)."""
