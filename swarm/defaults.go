package swarm

// Defaults returns the configuration a node runs with where Config leaves
// a field zero (no identity, source or logger), so that tools and
// benchmarks can print the settings in force.
func Defaults() Config {
	c, _ := Config{Identity: &Identity{}}.withDefaults()
	c.Identity, c.Logger, c.Now = nil, nil, nil
	return c
}
