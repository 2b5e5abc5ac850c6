package listener

import (
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pglogrepl"
	"go.uber.org/zap"
)

// relation is where a table's claimable-set columns are in its tuples; -1 for a
// column the table does not have, which counts as matching (see matches).
type relation struct {
	domains                        bool
	verification, provider, status int
}

// handle acts on one CopyData message and reports whether the server asked for a reply.
func (lg *Logical) handle(s *stream, data []byte) (reply bool, err error) {
	if len(data) == 0 {
		return false, errors.New("replication stream: empty message")
	}
	switch data[0] {
	case pglogrepl.PrimaryKeepaliveMessageByteID:
		k, err := pglogrepl.ParsePrimaryKeepaliveMessage(data[1:])
		if err != nil {
			return false, fmt.Errorf("replication stream: %w", err)
		}
		// A logical WAL sender's keepalive carries the position it has sent everything to.
		s.pos = max(s.pos, k.ServerWALEnd)
		return k.ReplyRequested, nil
	case pglogrepl.XLogDataByteID:
		x, err := pglogrepl.ParseXLogData(data[1:])
		if err != nil {
			return false, fmt.Errorf("replication stream: %w", err)
		}
		return false, lg.decode(s, x.WALData)
	}
	return false, nil
}

// decode acts on one pgoutput message: a claimable transaction wakes at its commit.
func (lg *Logical) decode(s *stream, data []byte) error {
	msg, err := pglogrepl.Parse(data)
	if err != nil {
		return fmt.Errorf("replication stream: decode: %w", err)
	}
	switch msg := msg.(type) {
	case *pglogrepl.RelationMessage:
		// Sent again whenever the table's definition changes.
		r := relation{domains: msg.RelationName == domainsTable, verification: -1, provider: -1, status: -1}
		for i, c := range msg.Columns {
			switch c.Name {
			case "verification_status":
				r.verification = i
			case "ssl_provider":
				r.provider = i
			case "ssl_status":
				r.status = i
			}
		}
		s.rels[msg.RelationID] = r
	case *pglogrepl.BeginMessage:
		s.claimable, s.xid = false, msg.Xid
	case *pglogrepl.InsertMessage:
		s.claimable = s.claimable || s.matches(msg.RelationID, msg.Tuple)
	case *pglogrepl.UpdateMessage:
		s.claimable = s.claimable || s.matches(msg.RelationID, msg.NewTuple)
	case *pglogrepl.CommitMessage:
		s.pos = max(s.pos, msg.TransactionEndLSN)
		if s.claimable {
			s.claimable = false
			lg.announce(s.xid)
			lg.wakes.send(Wake{Source: SourceNotify, At: time.Now()})
			lg.m.notifications.Inc()
			lg.log.Debug("claimable change", zap.Stringer("commit_lsn", msg.CommitLSN))
		}
	}
	return nil
}

// matches reports whether tuple, a new row of rel, is claimable (verified, acme,
// pending). Where it cannot tell it answers yes: a spurious wake-up costs a pass, a
// missed one a certificate until the poll.
func (s *stream) matches(rel uint32, tuple *pglogrepl.TupleData) bool {
	r, ok := s.rels[rel]
	if !ok {
		return true
	}
	if !r.domains {
		return false
	}
	if tuple == nil {
		return true
	}
	is := func(i int, want string) bool {
		if i < 0 || i >= len(tuple.Columns) {
			return true
		}
		c := tuple.Columns[i]
		switch c.DataType {
		case 'n': // NULL
			return false
		case 'u': // an unchanged TOASTed value, not sent; these columns never are
			return true
		default: // 't' text; 'b' binary, which for text is the same bytes
			return string(c.Data) == want
		}
	}
	return is(r.verification, "verified") && is(r.provider, "acme") && is(r.status, "pending")
}
