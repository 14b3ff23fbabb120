"""Files shipped with the package: `gin/` (a link to the repository's `gin/` directory, copied
into wheels), found by `t2t.runs.default_search_paths` when t2t is installed, not checked out."""
