import cerebro_db
return cerebro_db.__version__
