-- A subscription's transform (SPEC section 13, issue 61): a jq program run at delivery, as
-- text, checked when written. NULL: the body is delivered as stored. A nullable column:
-- nothing is rewritten, and an older node beside it delivers bodies untransformed until it is
-- upgraded (upgrade every node before setting a transform).
ALTER TABLE subscriptions ADD COLUMN transform TEXT;
