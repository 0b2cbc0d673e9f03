"""The `gandiva` command line: the one entry point that assembles the scheduler's, the
Migration Helper's and the simulator's subcommands (gandiva_cli.main)."""
