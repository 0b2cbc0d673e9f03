"""The project's own configuration package (named as Gandiva's `protos`)."""

MOMENTUM = 0.9
