"""What the tests share: fixture plugins (db, processes), helpers and the apps they run."""
