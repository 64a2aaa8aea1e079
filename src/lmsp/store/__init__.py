"""SQLite storage: connection, migrations that own the schema, one module per aggregate."""
