package seal

// SealV2ForTest seals plaintextPEM under key with the given nonce, as Seal does with
// a random one.
var SealV2ForTest = sealV2
