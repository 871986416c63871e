"""verl's experimental entry points, under the module paths verl's launch scripts name (docs/async.md)."""
