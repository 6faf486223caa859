"""ranksight: schemas."""
