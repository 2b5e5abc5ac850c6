package issuing

// The ACME challenges an order can be validated with (certworker_dns_state.challenge).
const (
	ChallengeHTTP01 = "http-01"
	ChallengeDNS01  = "dns-01"
)
