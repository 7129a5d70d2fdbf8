package etcdbackend

// EndsWaiting is how many releases and revokes wait for a transaction.
func (b *Backend) EndsWaiting() int { return b.ends.Waiting() }
