"""The two stages of detection: the stage engine, the rank summariser, the routes and where records go."""
