package main

import (
	"context"
	"errors"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/certworker/certworker/acme"
	"github.com/certworker/certworker/queue/issuing"
	"github.com/certworker/certworker/queue/worker"
)

// caFlags are the flags of each CA's CAA identities and of its external account
// binding's HMAC key read from a file, which keeps it off command lines. The fallback
// CA's other flags (--acme-fallback-directory, --acme-fallback-eab-hmac, ...) are
// run's.
type caFlags struct {
	ACMEEABHMACFile           string `name:"acme-eab-hmac-file" env:"CERTWORKER_ACME_EAB_HMAC_FILE" placeholder:"FILE" group:"ca" help:"A file holding the --acme-eab-hmac key (base64url; surrounding whitespace and line breaks ignored), which keeps it off command lines; not with --acme-eab-hmac."`
	ACMEFallbackEABHMACFile   string `name:"acme-fallback-eab-hmac-file" env:"CERTWORKER_ACME_FALLBACK_EAB_HMAC_FILE" placeholder:"FILE" group:"fallback" help:"A file holding the --acme-fallback-eab-hmac key; not with --acme-fallback-eab-hmac."`
	ACMECAAIdentities         string `name:"acme-caa-identities" env:"CERTWORKER_ACME_CAA_IDENTITIES" placeholder:"NAME[,NAME...]" group:"ca" help:"Issuer domain names of the CA in CAA records (letsencrypt.org), compared with a name's CAA records before ordering. Default: the directory's meta.caaIdentities."`
	ACMEFallbackCAAIdentities string `name:"acme-fallback-caa-identities" env:"CERTWORKER_ACME_FALLBACK_CAA_IDENTITIES" placeholder:"NAME[,NAME...]" group:"fallback" help:"Issuer domain names of the fallback CA in CAA records. Default: its directory's meta.caaIdentities."`
}

// validate checks the flags before anything connects: the identities, and the HMAC
// key files, read (with eabHMAC, inline the --acme-eab-hmac value), so that a secret
// not mounted is told before the database is. The fallback's key file is read here
// alone; fallbackEABHMAC checks it against its inline flag.
func (f caFlags) validate(eabHMAC string) error {
	if _, err := f.caaIdentities(); err != nil {
		return err
	}
	if _, err := f.fallbackCAAIdentities(); err != nil {
		return err
	}
	if _, err := f.eabHMAC(eabHMAC); err != nil {
		return err
	}
	_, err := f.fallbackEABHMAC("")
	return err
}

// caaIdentities is --acme-caa-identities, parsed; nil uses the directory's.
func (f caFlags) caaIdentities() ([]string, error) {
	ids, err := acme.ParseCAAIdentities("--acme-caa-identities", f.ACMECAAIdentities)
	if err != nil {
		return nil, usagef("%v", err)
	}
	return ids, nil
}

// fallbackCAAIdentities is --acme-fallback-caa-identities, parsed; nil uses the
// fallback directory's.
func (f caFlags) fallbackCAAIdentities() ([]string, error) {
	ids, err := acme.ParseCAAIdentities("--acme-fallback-caa-identities", f.ACMEFallbackCAAIdentities)
	if err != nil {
		return nil, usagef("%v", err)
	}
	return ids, nil
}

// eabHMAC is the first CA's HMAC key: --acme-eab-hmac (inline) or
// --acme-eab-hmac-file.
func (f caFlags) eabHMAC(inline string) (string, error) {
	return readEABHMAC("--acme-eab-hmac", inline, "--acme-eab-hmac-file", f.ACMEEABHMACFile)
}

// fallbackEABHMAC is the fallback CA's HMAC key: --acme-fallback-eab-hmac (inline)
// or --acme-fallback-eab-hmac-file.
func (f caFlags) fallbackEABHMAC(inline string) (string, error) {
	return readEABHMAC("--acme-fallback-eab-hmac", inline, "--acme-fallback-eab-hmac-file", f.ACMEFallbackEABHMACFile)
}

// readEABHMAC reads an HMAC key from whichever of its two flags is set; none is "".
// Both set is a usage error rather than one beating the other, as for the key
// encryption keys: a variable left over from before a move to the file would
// otherwise decide which key binds the account. Errors never hold the key.
func readEABHMAC(inlineFlag, inline, fileFlag, file string) (string, error) {
	if file == "" {
		return inline, nil
	}
	if inline != "" {
		return "", usagef("%s and %s are both set (as flags or as CERTWORKER_ variables): give the key one way", inlineFlag, fileFlag)
	}
	key, err := acme.ReadEABHMACFile(fileFlag, file)
	if err != nil {
		return "", usagef("%v", err)
	}
	return key, nil
}

// eabFlags names the first CA's binding flags in checkEAB's message (the fallback's
// check passes "--acme-fallback-eab-kid, --acme-fallback-eab-hmac-file or
// --acme-fallback-eab-hmac").
const eabFlags = "--acme-eab-kid, --acme-eab-hmac-file or --acme-eab-hmac"

// eabCheckTimeout bounds checkEAB's registration: a new-account request and the
// directory and nonce it needs, at the CA's usual speed, with room for a slow one.
const eabCheckTimeout = time.Minute

// checkEAB registers the ACME account at start when the CA needs an external account
// binding (as checkAccountKey does for the account's key): a key id or HMAC key
// the CA refuses is a configuration error (exit 2) naming the directory and the key
// id, never the key, before anything is claimed. A CA that cannot be asked does not
// stop the start: the first order registers (and a refusal then pauses the CA, not
// charging anyone). A CA without a binding is not contacted, as before.
//
// flags names the CA's binding flags in the message: eabFlags for the first CA's.
func checkEAB(ctx context.Context, issuer *acme.Issuer, log *zap.Logger, databaseURL, flags string) error {
	if !issuer.UsesEAB() {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, eabCheckTimeout)
	defer cancel()
	err := issuer.RegisterAccount(ctx)
	var refused *acme.EABRefusedError
	var ke *issuing.KeyError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &refused):
		return usagef("%s (%s)", refused, flags)
	case errors.As(err, &ke):
		return usagef("%s: start with the key it was sealed with in --key-encryption-key (or --key-encryption-key-file)", ke)
	}
	log.Warn("could not register the ACME account with its external account binding at start; starting anyway, and the first order registers it",
		zap.String("directory", issuer.DirectoryURL()), zap.String("error", redact(err.Error(), databaseURL)))
	return nil
}

// caaCheck is the worker's CAA check (worker.Config.CAA): each name's records, read
// through --preflight-resolver, against every CA the instance orders from. nil with
// --preflight off: certworker then checks nothing of a name before ordering (a private
// CA, tests whose names resolve only in the test CA's DNS), and the CA checks CAA
// itself, as it always does.
func (c *runCmd) caaCheck(issuers ...*acme.Issuer) (worker.CAAFunc, error) {
	if c.Preflight == acme.PreflightOff {
		return nil, nil
	}
	r, err := acme.NewCAAResolver(c.PreflightResolver)
	if err != nil {
		return nil, usagef("--preflight-resolver: %v", err)
	}
	return func(ctx context.Context, name string) (issuing.Verdict, string, error) {
		v, err := acme.CheckCAAFor(ctx, r, name, issuers...)
		if err != nil {
			return nil, "", err
		}
		allowed := make(map[string]bool, len(issuers))
		for n, i := range issuers {
			// A CA whose identities cannot be read now is not refused for it: the
			// CA checks CAA itself when it is asked.
			allowed[i.DirectoryURL()] = v.Allowed[n] || v.Undecided[n]
		}
		verdict := func(directory string) bool {
			ok, known := allowed[directory]
			return !known || ok
		}
		return verdict, strings.Join(v.Named, ", "), nil
	}, nil
}
