from cerebro_db.entrypoints.jobs import cerebro_db_forget_role
return cerebro_db_forget_role(plpy, "@extschema@", role_name=role_name)
