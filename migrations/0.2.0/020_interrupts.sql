-- Interrupts: a fit stopped by a query cancel of its coordinator (pg_cancel_backend,
-- statement_timeout) or by cerebro_db_cancel_fit is 'cancelled' (resumable with
-- madlib_keras_fit_resume, like 'interrupted' and 'failed'). cancel_requested is the flag
-- cerebro_db_cancel_fit sets and the coordinator polls between units.
ALTER TABLE @extschema@.fits DROP CONSTRAINT fits_status_check;
ALTER TABLE @extschema@.fits ADD CONSTRAINT fits_status_check
    CHECK (status IN ('running', 'done', 'failed', 'interrupted', 'cancelled'));
ALTER TABLE @extschema@.fits ADD COLUMN cancel_requested timestamptz;
