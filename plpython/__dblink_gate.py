from cerebro_db.catalog.dblink_gate import check
return check(token)
