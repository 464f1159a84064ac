"""Key-value stores checkpoints are written to: the Store interface, memory and files on desktop,
IndexedDB and the Origin Private File System in the browser."""
